"""What an operation's arguments hold, read before every kernel the mode runs (plain loops,
no generators): complex tensors, floating-point ones and their precision, whether any has
elements; and whether an overload takes a dtype."""

from __future__ import annotations

import functools

import torch

from twice.portable.dispatch import half

__all__ = ["has_complex", "scan", "takes_dtype", "INEXACT", "HALF", "VALUES"]


def has_complex(args, kwargs) -> bool:
    """Whether a complex tensor is among the arguments (in lists too). Runs before every exact
    operation: plain loops, no generators."""
    for value in args:
        if isinstance(value, torch.Tensor):
            if value.is_complex():
                return True
        elif isinstance(value, (list, tuple)):
            for v in value:
                if isinstance(v, torch.Tensor) and v.is_complex():
                    return True
    return bool(kwargs) and has_complex(tuple(kwargs.values()), None)


INEXACT, HALF, VALUES = 1, 2, 4


def scan(args, kwargs) -> int:
    """Flags over the floating-point and complex tensors among the arguments (in lists too):
    INEXACT for any, HALF for a float16 or bfloat16 one, VALUES when one has elements (0: no
    such tensor). One pass of plain loops: it runs before every kernel."""
    found = 0
    for value in args:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() or value.is_complex():
                found |= _flags(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()):
                    found |= _flags(v)
    if kwargs:
        found |= scan(tuple(kwargs.values()), None)
    return found


@functools.cache
def takes_dtype(func) -> bool:
    """Whether an overload's schema has a `dtype` argument (a factory's, a reduction's)."""
    return any(a.name == "dtype" for a in func._schema.arguments)


def _flags(t: torch.Tensor) -> int:
    return (HALF if t.dtype in half.HALF else INEXACT) | (VALUES if t.numel() else 0)
