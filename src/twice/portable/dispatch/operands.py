"""What an operation's arguments hold, read before every kernel the mode runs (plain loops,
no generators): complex tensors, sparse ones, floating-point ones and their precision, whether
any has elements; whether an overload takes a dtype; and whether its dimension arguments are in
range (`check_dims`: torch's IndexError before a kernel reads one)."""

from __future__ import annotations

import functools

import torch
from torch._prims_common import canonicalize_dim

from twice.portable.dispatch import half

__all__ = [
    "unusual",
    "scan",
    "promoted",
    "tensors",
    "takes_dtype",
    "check_dims",
    "INEXACT_ANY",
    "INEXACT",
    "HALF",
    "VALUES",
    "SPARSE",
    "COMPLEX_T",
    "LOOSE",
]


INEXACT, HALF, VALUES, SPARSE, COMPLEX_T, LOOSE = 1, 2, 4, 8, 16, 32
INEXACT_ANY = INEXACT | HALF  # a floating-point or complex operand of any precision


def unusual(args, kwargs) -> int:
    """COMPLEX_T where a complex tensor is among the arguments (in lists too), LOOSE where a
    sparse COO tensor that is not coalesced is (it may hold one position twice: torch adds such
    duplicates in its own order). Runs before every exact operation: plain loops, no
    generators."""
    found = 0
    for value in args:
        if isinstance(value, torch.Tensor):
            found |= _unusual(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                if isinstance(v, torch.Tensor):
                    found |= _unusual(v)
    if kwargs:
        found |= unusual(tuple(kwargs.values()), None)
    return found


def _unusual(t: torch.Tensor) -> int:
    loose = t.layout is torch.sparse_coo and not t.is_coalesced()
    return (COMPLEX_T if t.is_complex() else 0) | (LOOSE if loose else 0)


def scan(args, kwargs) -> int:
    """Flags over the floating-point and complex tensors among the arguments (in lists too):
    INEXACT for any, HALF for a float16 or bfloat16 one, VALUES when one has elements, SPARSE
    when one has a sparse layout (of any dtype), COMPLEX_T when one is complex (0: no such
    tensor). One pass of plain loops: it runs before every kernel."""
    found = 0
    for value in args:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() or value.is_complex():
                found |= _flags(value)
            elif value.layout is not torch.strided:
                found |= SPARSE
        elif isinstance(value, (list, tuple)):
            for v in value:
                if isinstance(v, torch.Tensor):
                    if v.is_floating_point() or v.is_complex():
                        found |= _flags(v)
                    elif v.layout is not torch.strided:
                        found |= SPARSE
    if kwargs:
        found |= scan(tuple(kwargs.values()), None)
    return found


_INTEGER_SUMS = {"bincount"}
"""Operations whose floating-point result from integer operands is a sum of integers in float64
(bincount's integer weights), exact below 2**53: torch's result, their index operands kept."""


def promoted(func, args, kwargs, result):
    """(args, kwargs) with every tensor that is not complex cast to the dtype of `result`'s
    first floating-point or complex tensor, as torch promotes an operation's integer operands
    for a floating-point result; None where no tensor is among them, or `func` is one of
    _INTEGER_SUMS."""
    if func.overloadpacket.__name__ in _INTEGER_SUMS:
        return None
    like = next(t for t in tensors(result) if t.is_floating_point() or t.is_complex())
    found = []

    def promote(value):
        if isinstance(value, torch.Tensor) and not value.is_complex():
            found.append(value)
            return value.to(like.dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(promote(v) for v in value)
        return value

    wide = promote(args), {k: promote(v) for k, v in kwargs.items()}
    return wide if found else None


def tensors(value) -> list:
    """The tensors in a result (a tensor, or a list or tuple of them and other values)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []


@functools.cache
def takes_dtype(func) -> bool:
    """Whether an overload's schema has a `dtype` argument (a factory's, a reduction's)."""
    return any(a.name == "dtype" for a in func._schema.arguments)


def _flags(t: torch.Tensor) -> int:
    return (
        (HALF if t.dtype in half.HALF else INEXACT)
        | (VALUES if t.numel() else 0)
        | (0 if t.layout is torch.strided else SPARSE)
        | (COMPLEX_T if t.is_complex() else 0)
    )


@functools.cache
def _dim_arguments(func) -> tuple:
    """The positions and names of an overload's `dim`/`dims` arguments, where its first argument
    is the tensor they index (`self` or `input`); empty otherwise."""
    arguments = func._schema.arguments
    if not arguments or arguments[0].name not in ("self", "input"):
        return ()
    if not isinstance(arguments[0].type, torch.TensorType):
        return ()
    return tuple((i, a.name) for i, a in enumerate(arguments) if a.name in ("dim", "dims"))


def check_dims(func, args, kwargs) -> None:
    """Raise torch's IndexError where a dimension argument is out of range for the tensor it
    indexes, as torch's kernel would before reading a value."""
    found = _dim_arguments(func)
    if not found or not isinstance(args[0], torch.Tensor):
        return
    rank = args[0].dim()
    for index, name in found:
        value = args[index] if index < len(args) else kwargs.get(name)
        for dim in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(dim, int):
                canonicalize_dim(rank, dim)
