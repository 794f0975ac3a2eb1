"""float16 and bfloat16 under portable mode: every kernel runs on float32 copies, rounded to the
half dtype at the end.

A half-precision operand widens to float32 exactly, so the float32 kernel sees the same values;
its products of half-precision operands are exact (8 or 11 significant bits each: the float32
slicing keeps 21 or more below each row's largest magnitude, so nothing is dropped below 13
binary orders of range), its sums are exact, and it rounds once to float32. That float32 result
is then rounded to the half dtype (round to nearest even): the nearest half-precision value but
where the float32 result sits exactly halfway between two of them, which is rare and decided by
the values alone. Either way every bit depends on the inputs only, on any machine.

What the outputs' dtypes are is asked of torch (the operation run on meta tensors), so an
operation whose result is float32 by its arguments (a sum with `dtype=torch.float32`) stays so.
The answer is kept per overload and argument signature (`_signature`: each tensor's dtype and
device, each other value's type, or the value itself where it is a flag, a dtype, a device, a
string or the like), where the meta run gave one: torch's promotion reads nothing else, and a
meta run goes through Python decompositions that cost more than the kernel (1.5 ms for an
`addmm`). A call with a 0-dimensional tensor is asked afresh: promotion tells such a tensor
from a wrapped Python number, which Python cannot see.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

__all__ = ["HALF", "run"]

HALF = (torch.float16, torch.bfloat16)


def _is_half(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in HALF


_VALUES = (str, torch.dtype, torch.device, torch.layout, torch.memory_format, type(None))
_CACHE: dict = {}
_CACHE_SIZE = 4096


class _Uncached(Exception):
    """A signature that does not decide the dtypes (a 0-dimensional tensor)."""


def _signature(value):
    """What of an argument the dtypes of an operation's outputs can depend on."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise _Uncached
        return ("tensor", value.dtype, value.device.type)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_signature(v) for v in value))
    if isinstance(value, dict):
        return ("dict", *((k, _signature(v)) for k, v in sorted(value.items())))
    if isinstance(value, (bool, *_VALUES)):  # a flag may choose the dtype (half_to_float)
        return (type(value), value)
    return type(value)


def _expected(func, args, kwargs):
    """The dtypes of the overload's outputs (flattened), or None: from a run on meta tensors,
    kept per overload and argument signature."""
    try:
        key = (func, _signature(args), _signature(kwargs))
    except _Uncached:
        return _meta_dtypes(func, args, kwargs)
    found = _CACHE.get(key)
    if found is None:
        found = _meta_dtypes(func, args, kwargs)
        if found is not None:  # a call that failed (a dim out of range) decides nothing
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.clear()
            _CACHE[key] = found
    return found


def _meta_dtypes(func, args, kwargs):
    """The dtypes of the overload's outputs (flattened), from a run on meta tensors, or None."""

    def meta(value):
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(
                value.shape, value.stride(), dtype=value.dtype, device="meta"
            )
        return value

    try:
        out = func(*tree_map(meta, args), **tree_map(meta, kwargs))
    except Exception:  # no meta kernel, or a data-dependent shape
        return None
    leaves, _ = tree_flatten(out)
    return [leaf.dtype if isinstance(leaf, torch.Tensor) else None for leaf in leaves]


@functools.cache
def _written(func) -> tuple[tuple[int, str], ...]:
    """The positions and names of the arguments the overload writes (in-place and out=)."""
    return tuple(
        (i, a.name)
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def _widened(value):
    """value with its half-precision tensors (in lists and dicts too) as float32 copies; the
    same object where it holds none (plain loops: this runs on every half-precision call)."""
    if isinstance(value, torch.Tensor):
        return value.to(torch.float32) if value.dtype in HALF else value
    if isinstance(value, (list, tuple)):
        items = [_widened(v) for v in value]
        if any(a is not b for a, b in zip(items, value)):
            return type(value)(items) if isinstance(value, list) else tuple(items)
        return value
    if isinstance(value, dict):
        return {k: _widened(v) for k, v in value.items()}
    return value


def _leaves(out):
    """(leaves, rebuild) of a kernel's result: a tensor or a flat tuple or list directly, any
    other structure through pytree."""
    if isinstance(out, torch.Tensor):
        return [out], lambda leaves: leaves[0]
    if isinstance(out, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in out):
        kind = type(out)
        return list(out), lambda leaves: kind(leaves) if kind in (tuple, list) else kind(*leaves)
    leaves, spec = tree_flatten(out)
    return leaves, lambda found: tree_unflatten(found, spec)


def run(func, kernel, args, kwargs):
    """`kernel` (a float32/float64 portable kernel for `func`) on float32 copies of the half
    precision arguments; outputs rounded to the dtypes torch gives them, written arguments
    written back."""
    expected = _expected(func, args, kwargs)
    wide_args = [_widened(v) for v in args]
    wide_kwargs = {k: _widened(v) for k, v in kwargs.items()}
    out = kernel(*wide_args, **wide_kwargs)
    originals = []
    for index, name in _written(func):
        original = args[index] if index < len(args) else kwargs.get(name)
        copy = wide_args[index] if index < len(args) else wide_kwargs.get(name)
        if _is_half(original) and copy is not original:
            original.copy_(copy)
            originals.append((copy, original))
    leaves, rebuild = _leaves(out)
    if expected is None or len(expected) != len(leaves):
        target = next(v.dtype for v in tree_flatten((args, kwargs))[0] if _is_half(v))
        expected = [target] * len(leaves)
    rounded = []
    for leaf, dtype in zip(leaves, expected):
        for copy, original in originals:
            if leaf is copy:
                leaf = original
                break
        else:
            if isinstance(leaf, torch.Tensor) and dtype is not None and leaf.dtype != dtype:
                leaf = leaf.to(dtype)
        rounded.append(leaf)
    return rebuild(rounded)
