"""Portable kernels for the Fourier transforms every `torch.fft` function and `torch.stft` reach
(`_fft_r2c`, `_fft_c2r`, `_fft_c2c`, forward and backward), and for a complex tensor times or
divided by a real one (their backward formulas double entries; a spectrum is scaled by hand).

Each transformed dimension is one float64 product (ordered.py) with twice's own twiddle matrix
(arithmetic/dft.py), the dimensions one after another in the order of `dim` (a real-to-complex
transform's last dimension first, a complex-to-real one's last), all in float64; the
normalisation is one IEEE division of the float64 result (by n, or by the correctly rounded
sqrt(n)), and the result is rounded once to its dtype (complex64 for float32 signals).
"""

from __future__ import annotations

import math

import torch
from torch._prims_common import canonicalize_dim

from twice.portable.arithmetic import dft
from twice.portable.dispatch.table import PortableUnsupported, complex_kernel, kernel

__all__ = ["fft_r2c", "fft_c2r", "fft_c2c", "mul_real", "mul_real_", "div_real", "div_real_"]

_F64 = torch.float64
_BY_ROOT_N, _BY_N = 1, 2  # ATen's fft_norm_mode: 0 none, 1 by sqrt(n), 2 by n
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The real and imaginary parts of a complex tensor in float64 (copies, exact)."""
    if x.dtype not in _REAL:
        raise PortableUnsupported(f"a Fourier transform of {x.dtype}")
    pairs = torch.view_as_real(x.resolve_conj().resolve_neg()).to(_F64)
    return pairs[..., 0], pairs[..., 1]


def _real_dtype(x: torch.Tensor) -> torch.dtype:
    if x.dtype not in (torch.float32, torch.float64):
        raise PortableUnsupported(f"a Fourier transform of {x.dtype}")
    return x.dtype


def _normalised(values: tuple, normalization: int, sizes: list[int]) -> tuple:
    """Each float64 tensor divided once by n or sqrt(n) (n the product of the signal's sizes)."""
    if normalization not in (_BY_ROOT_N, _BY_N):
        return values
    n = math.prod(sizes)
    divisor = math.sqrt(n) if normalization == _BY_ROOT_N else float(n)
    return tuple(v / divisor for v in values)


def _complex(re: torch.Tensor, im: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """re + i im, each part rounded once to `dtype`'s real dtype."""
    return torch.complex(re.to(dtype), im.to(dtype))


@kernel("_fft_r2c.default")
def fft_r2c(x, dim, normalization, onesided):
    """The forward transform of a real tensor over `dim`: the last of them one-sided (entries
    0 .. n // 2) when `onesided`."""
    dtype = _real_dtype(x)
    dims = [canonicalize_dim(x.dim(), d) for d in dim]
    re, im = dft.real_dft(x.to(_F64), dims[-1], onesided)
    for d in dims[:-1]:
        re, im = dft.complex_dft(re, im, d, True)
    re, im = _normalised((re, im), normalization, [x.shape[d] for d in dims])
    return _complex(re, im, dtype)


@kernel("_fft_c2c.default", complex_operands=True)
def fft_c2c(x, dim, normalization, forward):
    """The forward (exponent -) or backward (+) transform of a complex tensor over `dim`."""
    re, im = _parts(x)
    dims = [canonicalize_dim(x.dim(), d) for d in dim]
    for d in dims:
        re, im = dft.complex_dft(re, im, d, forward)
    re, im = _normalised((re, im), normalization, [x.shape[d] for d in dims])
    return _complex(re, im, _REAL[x.dtype])


@kernel("_fft_c2r.default", complex_operands=True)
def fft_c2r(x, dim, normalization, last_dim_size):
    """The backward transform of a one-sided spectrum over `dim` to a real tensor whose last
    transformed dimension has `last_dim_size` entries."""
    re, im = _parts(x)
    dims = [canonicalize_dim(x.dim(), d) for d in dim]
    for d in dims[:-1]:
        re, im = dft.complex_dft(re, im, d, False)
    (out,) = _normalised(
        (dft.hermitian_dft(re, im, dims[-1], last_dim_size),),
        normalization,
        [x.shape[d] for d in dims[:-1]] + [last_dim_size],
    )
    return out.to(_REAL[x.dtype])


def _by_real(z, factor, dtype):
    """z's parts as a real tensor of `dtype`'s precision (one more last dimension), and the real
    factor shaped to broadcast against them; refused where the factor is complex."""
    if isinstance(factor, complex) or (isinstance(factor, torch.Tensor) and factor.is_complex()):
        raise PortableUnsupported("complex arithmetic")
    parts = torch.view_as_real(z.resolve_conj().resolve_neg().to(dtype))
    if isinstance(factor, torch.Tensor):
        factor = factor.to(parts.dtype).unsqueeze(-1)
    return parts, factor


@complex_kernel("mul.Tensor", "mul.Scalar")
def mul_real(x, other):
    """A complex tensor times a real tensor or number (either side): each part multiplied once
    (torch multiplies by the complex other + 0i, whose zero parts' signs follow its code path)."""
    z, factor = (x, other) if isinstance(x, torch.Tensor) and x.is_complex() else (other, x)
    parts, factor = _by_real(z, factor, torch.result_type(x, other))
    return torch.view_as_complex(parts * factor)


@complex_kernel("div.Tensor", "div.Scalar")
def div_real(x, other):
    """A complex tensor divided by a real tensor or number: each part divided once (torch
    divides by the complex other + 0i, through a reciprocal on some code paths)."""
    if not (isinstance(x, torch.Tensor) and x.is_complex()):
        raise PortableUnsupported("complex arithmetic")
    parts, factor = _by_real(x, other, torch.result_type(x, other))
    return torch.view_as_complex(parts / factor)


@complex_kernel("mul_.Tensor", "mul_.Scalar")
def mul_real_(x, other):
    """mul_real in place."""
    return x.copy_(mul_real(x, other))


@complex_kernel("div_.Tensor", "div_.Scalar")
def div_real_(x, other):
    """div_real in place."""
    return x.copy_(div_real(x, other))


@kernel("polar.default")
def _polar(magnitude, angle):
    """abs (cos angle + i sin angle): twice's sine and cosine in float64, each part one product,
    rounded once to the complex dtype."""
    from twice.portable.ops.functions import cos, sin

    if magnitude.dtype not in (torch.float32, torch.float64):
        raise PortableUnsupported(f"polar of {magnitude.dtype}")
    r, theta = torch.broadcast_tensors(magnitude.to(torch.float64), angle.to(torch.float64))
    parts = torch.stack([r * cos(theta), r * sin(theta)], -1).to(magnitude.dtype)
    return torch.view_as_complex(parts.contiguous())
