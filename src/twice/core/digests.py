"""Exact digests of tensors, state dicts and nested batches: equal digests mean equal bits.

A digest covers the dtype, the shape and every byte of the data in logical (row-major) order, so
a view, a non-contiguous tensor and its contiguous copy agree, while 0.0 and -0.0, two NaN
payloads, or float32 and int32 with the same bytes do not. CPU data is hashed with xxh3-128.
Tensors on an accelerator are folded on the device into a few 64-bit words (an NH-style universal
hash over 32-bit word pairs with position-derived keys) and only those words leave the device.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import sys
import types
from typing import Any

import xxhash

from twice import _process

try:  # the compiled part (setup.py); where not built, None: the same values come from Python
    from twice import _native as native
except ImportError:
    native = None

__all__ = [
    "digest", "Digester", "device_digest", "dtensor_type", "local_tensor", "tensor_bytes_view"
]  # fmt: skip

_TAG_NONE, _TAG_BOOL, _TAG_INT, _TAG_FLOAT, _TAG_STR, _TAG_BYTES = (
    b"N",
    b"?",
    b"i",
    b"f",
    b"s",
    b"b",
)
_TAG_SEQ, _TAG_MAP, _TAG_TENSOR, _TAG_ARRAY, _TAG_DATACLASS, _TAG_OPAQUE = (
    b"[",
    b"{",
    b"T",
    b"A",
    b"D",
    b"O",
)
_TAG_DEVICE_TENSOR, _TAG_SPARSE, _TAG_NESTED, _TAG_QUANTIZED = b"G", b"S", b"J", b"Q"
_TAG_OBJECT = b"R"
_TAG_WRAPPER = b"W"

# Types a lenient Digester (the step trace's batch digests) could only identify by name, in the
# order first met: the step trace warns about each once, since a difference in them goes unseen.
OPAQUE_TYPES: list[str] = []


def _torch():
    import torch

    return torch


class _NoTensor:  # stands in for torch.Tensor when torch is not imported: nothing is an instance
    pass


def _numpy_types() -> tuple[type, ...]:
    """numpy's array and scalar types, or none while numpy is not (yet wholly) imported."""
    np = sys.modules.get("numpy")
    return tuple(t for t in (getattr(np, "ndarray", None), getattr(np, "generic", None)) if t)


class Digester:
    """Incremental digest over a sequence of values (see `digest`)."""

    def __init__(self, strict: bool = True, folds: dict | None = None):
        self._hash = xxhash.xxh3_128()
        self._strict = strict
        self._folds = folds or {}  # id(tensor) -> its device_fold, made for many at once

    def _frame(self, tag: bytes, payload: bytes) -> None:
        self._hash.update(tag + len(payload).to_bytes(8, "little") + payload)

    def update(self, value: Any) -> Digester:
        """Feed one value (tensor, array, number, string, or a nesting of those)."""
        # No tensor without torch loaded (not importing it keeps the launcher fast), nor while
        # another thread is still importing it and `Tensor` is not there yet.
        tensor_type = getattr(sys.modules.get("torch"), "Tensor", _NoTensor)
        if isinstance(value, tensor_type):  # first: batches are mostly tensors
            self._update_tensor(value)
        elif type(value) is tuple or type(value) is list:  # next: batches are mostly tuples of them
            self._update_sequence(value)
        elif value is None:
            self._frame(_TAG_NONE, b"")
        elif isinstance(value, bool):
            self._frame(_TAG_BOOL, b"1" if value else b"0")
        elif isinstance(value, int):
            self._frame(_TAG_INT, str(value).encode())
        elif isinstance(value, float):
            self._frame(_TAG_FLOAT, struct.pack("<d", value))
        elif isinstance(value, str):
            self._frame(_TAG_STR, value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            self._frame(_TAG_BYTES, bytes(value))
        elif isinstance(value, _numpy_types()):
            # (an array exists only once NumPy is loaded: the core never imports it on its own)
            self._update_array(sys.modules["numpy"].asarray(value))
        elif isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
            keys = list(value.keys())
            self._frame(_TAG_MAP, str(len(keys)).encode())
            for key in keys:
                self.update(key)
                self.update(value[key])
        elif isinstance(
            value, (list, tuple)
        ):  # subclasses: after the mapping test, which a subclass may pass
            self._update_sequence(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = dataclasses.fields(value)
            self._frame(
                _TAG_DATACLASS, type(value).__qualname__.encode() + b":" + str(len(fields)).encode()
            )
            for field in fields:
                self.update(field.name)
                self.update(getattr(value, field.name))
        elif self._strict:
            raise TypeError(
                f"cannot digest a {type(value).__module__}.{type(value).__qualname__}; "
                "digest takes tensors, arrays, numbers, strings, bytes, and lists, tuples, dicts "
                "and dataclasses of those"
            )
        else:
            self._update_object(value)
        return self

    def _update_sequence(self, value: list | tuple) -> None:
        self._frame(_TAG_SEQ, type(value).__name__.encode() + b":" + str(len(value)).encode())
        for item in value:
            self.update(item)

    def _update_object(self, value: Any) -> None:
        """Lenient mode (batches in the step trace) only: an object of a plain class (a user's
        `Batch` holding tensors as attributes) as its class and its attributes, in name order;
        anything else, and an object met again inside itself, by its type alone, noted in
        OPAQUE_TYPES. Capture must never crash a training loop."""
        name = f"{type(value).__module__}.{type(value).__qualname__}"
        active = self.__dict__.setdefault("_active", set())
        if id(value) in active:  # a reference back to an object being digested
            self._frame(_TAG_OPAQUE, b"cycle:" + name.encode())
            return
        fields = _attributes(value)
        if fields is None:
            if name not in OPAQUE_TYPES:
                OPAQUE_TYPES.append(name)
            self._frame(_TAG_OPAQUE, name.encode())
            return
        active.add(id(value))
        try:
            self._frame(_TAG_OBJECT, f"{name}:{len(fields)}".encode())
            for key, item in fields:
                self.update(key)
                self.update(item)
        finally:
            active.discard(id(value))

    def _update_tensor(self, tensor) -> None:
        kind = _wrapper_kind(tensor)
        if kind == _SHARDED:  # a DTensor: this rank's shard, as the plain tensor it is
            self._update_tensor(tensor._local_tensor)
            return
        if kind == _WRAPPER:  # another wrapper subclass: its type, then the tensors it wraps
            names, _ = tensor.__tensor_flatten__()
            cls = type(tensor)
            self._frame(
                _TAG_WRAPPER,
                f"{cls.__module__}.{cls.__qualname__}|{tensor.dtype}|{tuple(tensor.shape)}|"
                f"{'|'.join(names)}".encode(),
            )
            for name in names:
                self._update_tensor(getattr(tensor, name))
            return
        if tensor.is_nested:  # variable-length sequences: the layout, then each component in order
            parts = tensor.unbind()
            self._frame(_TAG_NESTED, f"{tensor.layout}|{tensor.dtype}|{len(parts)}".encode())
            for part in parts:
                self._update_tensor(part)
            return
        head = _plain_head(tensor)
        if head is not None:  # the common case (a batch from a DataLoader), framed as below
            _feed_head(self._hash.update, tensor, head)
            return
        torch = _torch()
        if tensor.layout != torch.strided:
            parts = sparse_parts(tensor)
            if parts is None:
                raise TypeError(
                    f"cannot digest a {tensor.layout} tensor; convert it with .to_dense() first"
                )
            # A sparse tensor (an nn.Embedding(sparse=True) gradient) as what it holds: its index
            # and value tensors as they are, duplicates included, under its layout and shape.
            self._frame(
                _TAG_SPARSE,
                f"{tensor.layout}|{tensor.dtype}|{tuple(tensor.shape)}|{len(parts)}".encode(),
            )
            for part in parts:
                self._update_tensor(part)
            return
        device = tensor.device.type
        if device == "meta":
            raise TypeError("cannot digest a meta tensor: it has no data")
        if tensor.is_quantized:  # the integers and what maps them to values: scales, zeros, axis
            scheme = tensor.qscheme()
            if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                mapping, parts = f"{scheme}|{tensor.q_scale()!r}|{tensor.q_zero_point()}", ()
            else:
                mapping = f"{scheme}|{tensor.q_per_channel_axis()}"
                parts = (tensor.q_per_channel_scales(), tensor.q_per_channel_zero_points())
            self._frame(_TAG_QUANTIZED, f"{tensor.dtype}|{tuple(tensor.shape)}|{mapping}".encode())
            for part in (tensor.int_repr(), *parts):
                self._update_tensor(part)
            return
        header = f"{tensor.dtype}|{tuple(tensor.shape)}".encode()
        if device == "cpu":
            self._frame(_TAG_TENSOR, header)
            data = tensor_bytes_view(tensor)
            self._hash.update(len(data).to_bytes(8, "little"))
            self._hash.update(data.buffer if isinstance(data, _process.Pinned) else data)
        else:
            words = self._folds.get(id(tensor))
            if words is None:
                from twice.core.device_fold import device_fold

                words = device_fold(tensor)
            self._frame(_TAG_DEVICE_TENSOR, header + b"|" + words)

    def _update_array(self, array) -> None:
        import numpy as np

        if array.dtype.hasobject:
            raise TypeError("cannot digest a NumPy array of Python objects")
        array = np.ascontiguousarray(array)
        self._frame(_TAG_ARRAY, f"{array.dtype.str}|{array.shape}".encode())
        data = memoryview(array).cast("B") if array.size else b""
        self._hash.update(len(data).to_bytes(8, "little"))
        self._hash.update(data)

    def hexdigest(self) -> str:
        """The digest of everything fed so far (32 hex digits of XXH3-128)."""
        return self._hash.hexdigest()


def _attributes(value: Any) -> list[tuple[str, Any]] | None:
    """The instance attributes of an object of a plain Python class (its __dict__ and __slots__),
    sorted by name; None for what has none to read (C types, functions, classes, modules)."""
    if isinstance(value, _NOT_OBJECTS):
        return None
    namespace = getattr(value, "__dict__", None)
    fields = dict(namespace) if isinstance(namespace, dict) else {}
    slotted = False
    for cls in type(value).__mro__[:-1]:  # not object's
        slots = cls.__dict__.get("__slots__")
        if slots is None:
            continue
        slotted = True
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                fields.setdefault(slot, getattr(value, slot))
    if not isinstance(namespace, dict) and not slotted:
        return None
    return sorted(fields.items(), key=lambda item: str(item[0]))


_NOT_OBJECTS = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
)


def sparse_parts(tensor) -> tuple | None:
    """The tensors that make up a sparse tensor, in a fixed order, or None for a layout not known
    here:
    COO (indices, values); compressed layouts (compressed indices, plain indices, values)."""
    torch = _torch()
    layout = tensor.layout
    if layout == torch.sparse_coo:
        return tensor._indices(), tensor._values()
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return tensor.crow_indices(), tensor.col_indices(), tensor.values()
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return tensor.ccol_indices(), tensor.row_indices(), tensor.values()
    return None


def tensor_bytes_view(tensor):
    """The tensor's bytes in logical order (a zero-copy buffer when it is already contiguous)."""
    if tensor.dtype.is_complex:
        tensor = tensor.resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return _process.pinned(tensor, nbytes)  # its bytes where they lie, `tensor` kept alive


def digest(value: Any, *, strict: bool = True) -> str:
    """Return the exact digest (32 hex characters) of a tensor, array, state dict or nested batch.

    >>> import torch
    >>> digest(torch.zeros(3)) == digest(torch.zeros(3))
    True
    >>> digest(torch.zeros(3)) == digest(torch.zeros(3, dtype=torch.float64))
    False
    """
    return Digester(strict=strict).update(value).hexdigest()


_headers: dict = {}  # (dtype, shape) -> framed header bytes


def _framed_header(tensor) -> bytes:
    """The framed dtype-and-shape header that `Digester` writes before a CPU tensor's bytes."""
    key = (tensor.dtype, tensor.shape)
    framed = _headers.get(key)
    if framed is None:
        header = f"{tensor.dtype}|{tuple(tensor.shape)}".encode()
        framed = _headers[key] = _TAG_TENSOR + len(header).to_bytes(8, "little") + header
    return framed


def digest_bytes(data: bytes) -> str:
    """`digest(data)` for a bytes object, in one hash call."""
    return xxhash.xxh3_128_hexdigest(_TAG_BYTES + len(data).to_bytes(8, "little") + data)


def digest_buffers(*buffers) -> str:
    """`digest_bytes(b"".join(buffers))`, hashed where the buffers lie (ctypes arrays, bytes)."""
    hasher = xxhash.xxh3_128(_TAG_BYTES + sum(map(len, buffers)).to_bytes(8, "little"))
    for buffer in buffers:
        hasher.update(buffer)
    return hasher.hexdigest()


# (dtype, shape) -> (framed header and byte count, the reader of the bytes at an address (from
# twice._process), byte count, norm kind for twice._native: 1 float32, 2 float64, 0 none)
_plain_heads: dict = {}
_strided: list = []  # [torch.strided], once torch is loaded


def device_digest(dtype: Any, shape: tuple, words: bytes) -> str:
    """`digest(tensor)` of an accelerator tensor of `dtype` and `shape` whose `device_fold` is
    `words`, without the tensor (the step trace reads the fold a step late)."""
    payload = f"{dtype}|{tuple(shape)}|".encode() + words
    frame = _TAG_DEVICE_TENSOR + len(payload).to_bytes(8, "little") + payload
    return xxhash.xxh3_128(frame).hexdigest()


def digest_tensor(tensor: Any) -> str:
    """`digest(tensor)` for one tensor, with the per-call work kept small: the step trace digests
    every parameter and gradient of every step, and for small models the Python around the hash
    costs more than the hashing, the more so right after a step has evicted it from the caches.
    So for a plain CPU tensor it is three hash calls (the cached head of its frame, its bytes in
    place, the digest). Same value as `digest(tensor)` (a test holds them together)."""
    head = _plain_head(tensor)
    if head is None:
        return digest(tensor)
    hasher = xxhash.xxh3_128()
    _feed_head(hasher.update, tensor, head)
    return hasher.hexdigest()


def _feed_head(update, tensor: Any, head: tuple) -> None:
    """Frame a plain CPU tensor as `Digester` frames any CPU tensor: its cached frame head (see
    `_plain_head`), then its bytes where they lie."""
    update(head[0])
    if head[1] is not None:
        update(head[1](tensor.data_ptr()))


# What a tensor's type is to the digest, by type: plain (its bytes where they lie), a DTensor (its
# local shard) or another wrapper subclass, one without storage of its own that flattens into
# the tensors it wraps (`__tensor_flatten__`, as torch.compile requires of them).
_PLAIN, _SHARDED, _WRAPPER = 0, 1, 2
_wrapper_kinds: dict[type, int] = {}


def dtensor_type() -> type | None:
    """torch's DTensor class, or None while torch.distributed.tensor is not loaded (then no
    DTensor exists)."""
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def _wrapper_kind(tensor: Any) -> int:
    cls = type(tensor)
    kind = _wrapper_kinds.get(cls)
    if kind is None:
        if not hasattr(cls, "__tensor_flatten__"):
            kind = _PLAIN
        else:
            dtensor = dtensor_type()
            kind = _SHARDED if dtensor is not None and issubclass(cls, dtensor) else _WRAPPER
        _wrapper_kinds[cls] = kind
    return kind


def local_tensor(tensor: Any) -> Any:
    """The tensor whose bytes this process holds: a DTensor's local shard (its digest is the
    shard's), any other tensor itself."""
    return tensor._local_tensor if _wrapper_kind(tensor) == _SHARDED else tensor


def _plain_head(tensor: Any) -> tuple | None:
    """The cached frame head of a dense, contiguous, real CPU tensor (made on first meeting its
    dtype and shape), as `_plain_heads` holds it; None for any other tensor (digest() frames
    those, wrapper subclasses included: they have no bytes of their own)."""
    if _wrapper_kind(tensor) != _PLAIN:
        return None
    if not _strided:
        _strided.append(_torch().strided)
    if not (
        tensor.is_cpu and tensor.layout is _strided[0] and tensor.is_contiguous()
    ):  # (a compressed layout has no is_contiguous)
        return None
    key = (tensor.dtype, tensor.shape)
    head = _plain_heads.get(key)
    if head is None:
        if key[0].is_complex or tensor.is_quantized:
            return None
        if len(_plain_heads) > 4096:
            _plain_heads.clear()
        nbytes = tensor.numel() * tensor.element_size()
        torch = _torch()
        kind = {torch.float32: 1, torch.float64: 2}.get(key[0], 0)  # norms in twice._native
        head = _plain_heads[key] = (
            _framed_header(tensor) + nbytes.to_bytes(8, "little"),
            _process.reader(nbytes) if nbytes else None,
            nbytes,
            kind,
        )
    return head


def digest_pairs(pairs: list[tuple[str, str]]) -> str:
    """Digest of (name, digest) pairs: the combined fingerprint of many tensors, in one hash
    call."""
    return xxhash.xxh3_128_hexdigest("\n".join(map("\t".join, pairs)).encode("utf-8"))


def float_bits(value: float) -> str:
    """A float as exact text (`float.hex`), with nan/inf spelled out."""
    if math.isnan(value):
        return "nan:" + struct.pack("<d", value).hex()
    return float.hex(value)
