"""The step trace's hot path: digests and L2 norms of many tensors in one call to the C module.

Every step digests every gradient and parameter and takes the gradients' norms, on code and data
the step has just evicted from the caches. So plain CPU tensors go to twice._native in one call,
which hashes each in 32 kB pieces and sums the squares of each piece while it is in the L1 cache.
Without the C module the same digests (core/digests.py) and the same norms (NumPy, `lanes_norm`)
come out bit for bit; tests hold the two paths together.
"""

from __future__ import annotations

import math
from typing import Any

from twice import _process
from twice.core import digests as _digests

__all__ = ["digest_many", "hash_items", "buffers_item", "tensor_item", "lanes_norm"]


def digest_many(tensors: list, norms: bool = False) -> tuple[list[str], list[float | None] | None]:
    """`digest_tensor` of each tensor and, with `norms`, the L2 norm of each float32 or float64 CPU
    tensor (None for the others: the caller takes torch's), in one pass over each tensor's bytes.

    The step trace's hot path: it digests every gradient and parameter and takes the gradients'
    norms after every step, where the Python and the torch calls around the hashing cost more
    than the hashing (ten times their warm cost, on code the step has just evicted from the
    caches). So plain CPU tensors go to twice._native in one call, which hashes each in 32 kB
    pieces and sums the squares of each piece while it is in the L1 cache. The norm is twice's
    own (`lanes_norm`), the same bits whether _native was built or not. A DTensor (FSDP2, tensor
    parallel) is this rank's shard: its digest and norm are the shard's."""
    tensors = list(map(_digests.local_tensor, tensors))
    if _digests.native is None:
        folds = _device_folds(tensors)
        return [
            _digests.digest_tensor(t)
            if t.is_cpu
            else _digests.Digester(folds=folds).update(t).hexdigest()
            for t in tensors
        ], [lanes_norm(t) for t in tensors] if norms else None
    items, where, digests = [], [], [None] * len(tensors)
    out: list[float | None] | None = [None] * len(tensors) if norms else None
    framed = []  # not plain: digest() frames them (device tensors folded together first)
    for i, tensor in enumerate(tensors):
        head = _digests._plain_head(tensor)
        if head is None:
            framed.append(i)
            continue
        items.append((head[0], tensor.data_ptr(), head[2], head[3] if norms else 0, None))
        where.append(i)
    if framed:
        folds = _device_folds([tensors[i] for i in framed])
        for i in framed:
            digests[i] = _digests.Digester(folds=folds).update(tensors[i]).hexdigest()
            if norms:
                out[i] = lanes_norm(tensors[i])
    if items:
        hashed, normed = _digests.native.hash(items)
        for i, value, norm in zip(where, hashed, normed):
            digests[i] = value
            if norms:
                out[i] = norm
    return digests, out


def _device_folds(tensors: list) -> dict:
    """id(tensor) -> device_fold for the dense accelerator tensors among `tensors`, made together:
    one device-to-host copy per device instead of one sync per tensor."""
    strided = [
        t
        for t in tensors
        if not t.is_cpu
        and t.device.type != "meta"
        and t.layout is _strided()
        and not t.is_quantized
        and not t.is_nested
    ]
    if not strided:
        return {}
    from twice.core.device_fold import device_fold_many

    return dict(zip(map(id, strided), device_fold_many(strided)))


def _strided():
    import torch

    return torch.strided


def hash_items(items: list) -> list[str] | None:
    """Digests of `buffers_item`s and `tensor_item`s in one call to twice._native; None where it
    was not built."""
    return None if _digests.native is None else _digests.native.hash(items)[0]


def buffers_item(main: Any, tail: bytes | None = None) -> tuple:
    """For `hash_items`: what `digest_buffers(main, tail)` digests, `main` a ctypes array (hashed
    where it lies)."""
    size = len(main)
    return (
        _digests._TAG_BYTES + (size + len(tail or b"")).to_bytes(8, "little"),
        _process.address_of(main),
        size,
        0,
        tail,
    )


def tensor_item(tensor: Any) -> tuple | None:
    """For `hash_items`: what `digest_tensor(tensor)` digests, for a plain CPU tensor (else None).
    The item holds the tensor's address, not the tensor: keep the tensor alive until it is
    hashed."""
    head = _digests._plain_head(tensor)
    return None if head is None else (head[0], tensor.data_ptr(), head[2], 0, None)


def lanes_norm(tensor: Any) -> float | None:
    """The L2 norm of a float32 or float64 CPU tensor as the step trace records it: the squares in
    double, in row-major order, summed into 32 running sums (element i into sum i mod 32), the
    sums added pairwise, the square root taken. A definition of twice's own, so that the compiled
    code (twice._native) and NumPy give the same bits; None for other tensors."""
    torch = _digests._torch()
    if not (
        tensor.is_cpu
        and tensor.layout is torch.strided
        and tensor.dtype in (torch.float32, torch.float64)
    ):
        return None
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if _digests.native is not None:
        width = tensor.element_size()
        return _digests.native.hash(
            [(b"", tensor.data_ptr(), tensor.numel() * width, 1 if width == 4 else 2, None)]
        )[1][0]
    import numpy as np

    values = tensor.numpy().reshape(-1).astype(np.float64)
    full = len(values) - len(values) % _LANES
    # Along axis 0 NumPy adds row after row (its pairwise summation is for the contiguous axis):
    # each lane's running sum in element order, as in C. A test holds the two together.
    sums = (
        np.zeros(_LANES)
        if not full
        else np.add.reduce(np.square(values[:full]).reshape(-1, _LANES), axis=0)
    )
    sums = [float(x) for x in sums]
    for i in range(full, len(values)):
        value = float(values[i])
        sums[i % _LANES] += value * value
    width = _LANES // 2
    while width:  # added pairwise: 32 sums, 16, ..., 1
        sums = [sums[2 * k] + sums[2 * k + 1] for k in range(width)]
        width //= 2
    return math.sqrt(sums[0])


_LANES = 32  # lanes_norm's running sums (as LANES in csrc/hashing.c)
