"""An exact product's last step at any range: its integers' sum times its operands' units,
rounded once.

SCALE: every exact product ends as `t * (unit_a * unit_b)`, `t` the slices' integer products
added level by level (each level a power of two below the last: levels_added), the units powers
of two.
Where `unit_a * unit_b` lies in [2**-900, 2**900] (every product of float32 operands, and of
float64 ones of ordinary magnitudes) that is one multiplication, exact unless the result itself
overflows or is subnormal, and then rounded once. Outside that band the units' product
overflows (an exact 0 would become 0 * inf = NaN) or underflows (the result would be rounded
twice, or lost); there the units' exponents are added as integers and applied in two steps, the
first exact, the second rounding once: the value the one multiplication gives wherever it is
safe, so the band's edge changes no bit. The compiled kernels take the same steps
(csrc/portable.h: scale_by)."""

from __future__ import annotations

import operator

import torch

__all__ = ["SAFE_LO", "SAFE_HI", "pow2", "ldexp_exact", "levels_added", "scaled"]

SAFE_LO, SAFE_HI = 2.0**-900, 2.0**900
_F64 = torch.float64


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0**k for int64 k in [-1022, 1023], from its bits (exact)."""
    return ((k.to(torch.int64) + 1023) << 52).contiguous().view(_F64)


def _exponent(unit: torch.Tensor) -> torch.Tensor:
    """k of a power of two 2**k (float64, normal), as int64."""
    return torch.frexp(unit)[1].to(torch.int64) - 1


def ldexp_exact(t: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """t * 2**k (float64 t, int64 k of any size) rounded once: t's mantissa first brought to the
    normal range's edge (exact), then the rest of the exponent (which rounds once, into the
    subnormal range or to infinity). Zeros, infinities and NaN come back as they are."""
    mantissa, exponent = torch.frexp(t)  # t = mantissa * 2**exponent, mantissa in [0.5, 1)
    total = torch.clamp(exponent.to(torch.int64) + k, -1100, 1100)  # beyond: 0 or inf either way
    first = torch.clamp(total, -1021, 1023)
    return (mantissa * pow2(first)) * pow2(total - first)


def scaled(t: torch.Tensor, unit_a, unit_b, scale=None, wide: bool = True) -> torch.Tensor:
    """t * scale(unit_a, unit_b) rounded once, where `scale` is the outer-product form that
    gives each output its one unit_a times its one unit_b (by default their broadcast product)
    and the units are powers of two in [2**-1022, 2**1023] (exact.unit_for's). `wide=False`
    (both operands float32 or narrower: their units' products always lie in the band) is the
    one multiplication."""
    scale = scale or operator.mul
    s = scale(unit_a, unit_b)
    if not wide:
        return t * s
    thirds = zip(_thirds(unit_a), _thirds(unit_b))  # each product of two thirds is normal
    k = sum(_exponent(scale(third_a, third_b)) for third_a, third_b in thirds)
    safe = (s >= SAFE_LO) & (s <= SAFE_HI)
    return torch.where(safe, t * s, ldexp_exact(t, k))


def _thirds(unit: torch.Tensor):
    """Three powers of two whose product is unit 2**k, each exponent within 341 of zero: for
    units in [2**-1022, 2**1023] a product of two of them lies in [2**-682, 2**682], normal
    (halves would not do: 2**512 * 2**512 overflows)."""
    k = _exponent(unit.to(_F64))
    first = torch.div(k, 3, rounding_mode="floor")
    second = torch.div(k - first, 2, rounding_mode="floor")
    return pow2(first), pow2(second), pow2(k - first - second)


def levels_added(levels, step):
    """The sum of a product's slice products, level by level: each level's products (integers,
    whose sum the slices' width keeps below 2**53) added exactly, then the levels, each times
    step**level, added in order, one rounding a level. A level's sum does not depend on which
    operand is on the left, so neither does the product: `a @ b` is `(b.mT @ a.mT).mT` bit for
    bit (autograd forms some gradients one way, a fused route the other)."""
    total = None
    for level, terms in enumerate(levels):
        exact = terms[0] + 0.0  # ZERO_SIGN
        for term in terms[1:]:
            exact = exact + term  # integers: exact, in any order
        exact = exact * step**level if level else exact
        total = exact if total is None else total + exact
    return total
