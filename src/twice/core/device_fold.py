"""A tensor's digest on its own device: its bytes folded into 32 bytes by integer sums there.

Copying a large accelerator tensor to the host to hash it costs more than the training step; the
fold runs on the device (NH-style keyed products and keyed XORs, summed modulo 2**64: exact and
order-independent) and only the 32 bytes travel. It runs on the CPU too, so that the algorithm is
checked without a GPU. Imports torch only when called.
"""

from __future__ import annotations

import struct

from twice.core.escaping import escape_controls

__all__ = ["device_fold", "device_fold_many"]

DEVICE_CHUNK_WORDS = 1 << 24
BLOCK_WORDS = 1 << 12  # device_fold_many aligns each tensor to blocks of this many words


def _torch():
    import torch

    return torch


def _mix64(x):
    """splitmix64 finaliser on an int64 tensor (wrapping arithmetic, logical shifts emulated)."""

    def shr(v, n):
        return (v >> n) & ((1 << (64 - n)) - 1)

    x = x ^ shr(x, 30)
    x = x * -4658895280553007687  # 0xbf58476d1ce4e5b9 as a signed 64-bit integer
    x = x ^ shr(x, 27)
    x = x * -7723592293110705685  # 0x94d049bb133111eb
    return x ^ shr(x, 31)


def device_fold(tensor) -> bytes:
    """Fold a tensor's bytes into 32 bytes on its own device (integer sums: order-independent,
    exact).

    Works on any device, the CPU included, so that the device algorithm can be checked here.
    """
    raw = _words_of(tensor)
    return struct.pack("<q", raw.numel()) + _fold_sums(raw).cpu().numpy().astype("<i8").tobytes()


_kernel: list = []  # [_fold_kernel.fold_sums or None], decided on the first CUDA tensor


def _triton_fold():
    """_fold_kernel.fold_sums where Triton is installed and works here, else None."""
    from twice import _process
    from twice.core.protocol import ChildSettings

    if not _kernel:
        fold = None
        if not ChildSettings.read(_process.environ(), "no_triton"):
            try:
                from twice._fold_kernel import fold_sums as fold
            except Exception:  # noqa: BLE001 - no Triton, or one that cannot load: torch's path
                fold = None
        _kernel.append(fold)
    return _kernel[0]


def _fold_sums(raw):
    """The four sums of device_fold for a tensor's bytes, left on the device (no sync)."""
    torch = _torch()
    fold = _triton_fold() if raw.is_cuda else None
    if fold is not None:
        try:
            return fold(raw)
        except Exception as exc:  # noqa: BLE001 - a Triton that cannot compile here: torch's path
            import warnings

            warnings.warn(
                escape_controls(f"twice: the Triton digest kernel failed ({exc}); using torch's"),
                stacklevel=2,
            )
            _kernel[0] = None
    nbytes = raw.numel()
    pad = (-nbytes) % 8
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=raw.device)])
    words = raw.view(torch.int64)
    low_mask = (1 << 32) - 1
    sums = torch.zeros(4, dtype=torch.int64, device=raw.device)
    for start in range(0, words.numel(), DEVICE_CHUNK_WORDS):
        chunk = words[start : start + DEVICE_CHUNK_WORDS]
        index = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=raw.device)
        low, high = chunk & low_mask, (chunk >> 32) & low_mask
        for lane in range(2):
            key = _mix64(index * 2 + lane * (1 << 40) + 0x5EED)
            k_low, k_high = key & low_mask, (key >> 32) & low_mask
            # NH: (a + k1 mod 2^32) * (b + k2 mod 2^32), summed mod 2^64; two lanes with other keys.
            products = ((low + k_low) & low_mask) * ((high + k_high) & low_mask)
            sums[lane] += products.sum()
            sums[2 + lane] += (chunk ^ key).sum()
    return sums


def _words_of(tensor):
    """A tensor's bytes as uint8 on its device (conjugate and negative views resolved)."""
    torch = _torch()
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    raw = tensor.contiguous().reshape(-1).view(torch.uint8)
    # a view that starts inside a word (x[1:] of float32) cannot be read as words where it lies
    return raw.clone() if raw.storage_offset() % 8 else raw


def device_fold_many(tensors: list) -> list[bytes]:
    """`device_fold` of each tensor (the same bytes), with a few dozen kernel launches and one
    device-to-host copy per device for the whole list instead of some forty launches and a sync
    per tensor: the step trace folds every parameter and gradient of every step, and on a GPU the
    per-tensor path cost several times the step itself.

    Small tensors are copied, each at a block-aligned offset, into buffers of at most one chunk;
    every block is folded with its words' own indices (padding masked out) and summed on the
    device, and each tensor's blocks are summed on the host (integer sums modulo 2**64: the same as
    the one-tensor fold, in any order). A tensor of a chunk or more is folded in place, alone."""
    import numpy as np

    torch = _torch()
    out: list[bytes | None] = [None] * len(tensors)
    by_device: dict = {}
    for i, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(i)
    for device, members in by_device.items():
        raws = {i: _words_of(tensors[i]) for i in members}
        large = [i for i in members if raws[i].numel() >= 8 * DEVICE_CHUNK_WORDS]
        groups, group, words = [], [], 0
        for i in members:
            if i in large:
                continue
            blocks = max(1, -(-raws[i].numel() // (8 * BLOCK_WORDS)))
            if group and words + blocks * BLOCK_WORDS > DEVICE_CHUNK_WORDS:
                groups.append(group)
                group, words = [], 0
            group.append(i)
            words += blocks * BLOCK_WORDS
        if group:
            groups.append(group)
        parts = [_fold_sums(raws[i])[:, None] for i in large]
        parts += [_fold_blocks([raws[i] for i in group], device) for group in groups]
        if not parts:
            continue
        found = torch.cat(parts, dim=1).cpu().numpy()
        column = len(large)
        for i, sums in zip(large, found.T):
            out[i] = struct.pack("<q", raws[i].numel()) + sums.astype("<i8").tobytes()
        with np.errstate(over="ignore"):
            for group in groups:
                for i in group:
                    count = max(1, -(-raws[i].numel() // (8 * BLOCK_WORDS)))
                    folded = found[:, column : column + count].sum(axis=1, dtype=np.int64)
                    out[i] = struct.pack("<q", raws[i].numel()) + folded.astype("<i8").tobytes()
                    column += count
    return out


_layouts: dict = {}  # (device, sizes) -> block starts, lengths, positions: made once per layout


def _fold_blocks(raws: list, device):
    """The four sums of each block of the tensors' bytes laid out block-aligned: int64 [4, blocks]
    on the device."""
    torch = _torch()
    zeros = torch.zeros(8 * BLOCK_WORDS, dtype=torch.uint8, device=device)
    parts = []
    for raw in raws:
        count = max(1, -(-raw.numel() // (8 * BLOCK_WORDS)))
        parts += [raw, zeros[: count * 8 * BLOCK_WORDS - raw.numel()]]
    chunk = torch.cat(parts).view(torch.int64).view(-1, BLOCK_WORDS)
    base, length, positions = _block_layout(tuple(raw.numel() for raw in raws), device)
    index, valid = base + positions, positions < length
    low_mask = (1 << 32) - 1
    low, high = chunk & low_mask, (chunk >> 32) & low_mask
    sums = [None] * 4
    for lane in range(2):
        key = _mix64(index * 2 + lane * (1 << 40) + 0x5EED)
        k_low, k_high = key & low_mask, (key >> 32) & low_mask
        products = ((low + k_low) & low_mask) * ((high + k_high) & low_mask)
        sums[lane] = torch.where(valid, products, 0).sum(dim=1)
        sums[2 + lane] = torch.where(valid, chunk ^ key, 0).sum(dim=1)
    return torch.stack(sums)


def _block_layout(sizes: tuple, device):
    """Each block's first word index within its tensor and its count of the tensor's words, kept
    on the device for the sizes seen (a host-to-device copy waits for the device to drain)."""
    torch = _torch()
    found = _layouts.get((device, sizes, BLOCK_WORDS))
    if found is not None:
        return found
    base, length = [], []
    for size in sizes:
        words = -(-size // 8)
        for b in range(max(1, -(-size // (8 * BLOCK_WORDS)))):
            base.append(b * BLOCK_WORDS)
            length.append(min(BLOCK_WORDS, max(0, words - b * BLOCK_WORDS)))
    # Only the per-block starts and lengths are kept (a few bytes a block); the [blocks, words]
    # index and mask are two kernels each time, rather than memory held for the whole run.
    found = (
        torch.tensor(base, dtype=torch.int64, device=device)[:, None],
        torch.tensor(length, dtype=torch.int64, device=device)[:, None],
        torch.arange(BLOCK_WORDS, dtype=torch.int64, device=device)[None, :],
    )
    if len(_layouts) >= 256:
        _layouts.clear()
    _layouts[(device, sizes, BLOCK_WORDS)] = found
    return found
