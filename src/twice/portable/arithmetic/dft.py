"""The discrete Fourier transform along one dimension as a float64 product with twice's own
twiddle matrix, so that its bits depend on neither the FFT library nor the thread count.

The twiddle factor of output k and input j is exp(-+2 pi i (k j mod n) / n): the integer k j is
reduced modulo n exactly (int64), the fraction (k j mod n) / n is one IEEE division, and its
cosine and sine come from `elementwise.sincos_turns`, computed once per length in float64. A
transform is then one float64 product (arithmetic/ordered.py: each output's sum in the inputs'
order) of a real matrix made of those cosines and sines with the signals' real and imaginary
parts stacked: [Re; Im] = [[C, -sS], [sS, C]] @ [re; im] (s = -1 forward, +1 backward). Each
signal (a column) is computed on its own, so a signal's result depends on it alone, not on the
rest of the batch; likewise each output row, so long transforms compute their twiddles a block
of rows at a time with the same bits. The cost is
O(n^2) per signal and transformed dimension (no fast algorithm: its rounding would follow the
factorisation of n).
"""

from __future__ import annotations

import functools

import torch

from twice.portable.arithmetic.elementwise import sincos_turns
from twice.portable.arithmetic.exact import exact_matmul

__all__ = ["twiddles", "complex_dft", "real_dft", "hermitian_dft"]

_F64 = torch.float64
_CACHED = 1024  # lengths up to this keep their whole matrices (16 MiB at 1024)
_BLOCK = 1 << 20  # twiddles per block of output rows for longer ones (8 MiB)


@functools.lru_cache(maxsize=16)
def twiddles(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, S): the n x n float64 matrices cos(2 pi (k j mod n) / n), sin(2 pi (k j mod n) / n)
    (a cache of the last 16 lengths and devices)."""
    return _rows(n, 0, n, device)


def _rows(n: int, start: int, stop: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows start .. stop - 1 of twiddles(n): the same values, computed alone."""
    k = torch.arange(start, stop, dtype=torch.int64, device=device)
    j = torch.arange(n, dtype=torch.int64, device=device)
    turns = (k[:, None] * j[None, :]) % n  # exact: n^2 stays far below 2^63
    sin, cos = sincos_turns(turns.to(_F64) / n)
    return cos, sin


def _blocks(n: int, rows: int, device, block: int | None):
    """(C, S) for blocks of the first `rows` rows of twiddles(n): one block of the
    cached matrices for short lengths, else a few rows at a time (the rows' twiddles computed
    alone). An output row is computed on its own, so no block size changes a bit."""
    if n <= _CACHED and block is None:
        cos, sin = twiddles(n, device)
        yield cos[:rows], sin[:rows]
        return
    step = max(1, (block or _BLOCK) // n)
    for start in range(0, rows, step):
        yield _rows(n, start, min(rows, start + step), device)


def _columns(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, list[int]]:
    """x with `dim` first, the other dimensions flattened into columns (one signal a column)."""
    moved = x.movedim(dim, 0)
    return moved.reshape(moved.shape[0], -1), list(moved.shape[1:])


def _back(columns: torch.Tensor, rest: list[int], dim: int) -> torch.Tensor:
    return columns.reshape([columns.shape[0], *rest]).movedim(0, dim)


def complex_dft(re: torch.Tensor, im: torch.Tensor, dim: int, forward: bool, block=None):
    """The transform of the complex float64 signals re + i im along `dim` (exponent sign -1
    forward, +1 backward, unnormalised): its (real, imaginary) parts in float64. `block` bounds
    the twiddles of one product (None: twice's default)."""
    n = re.shape[dim]
    cols_re, rest = _columns(re, dim)
    cols_im, _ = _columns(im, dim)
    signals = torch.cat([cols_re, cols_im], 0)
    out_re, out_im = [], []
    for cos, sin in _blocks(n, n, re.device, block):
        signed = -sin if forward else sin  # negation is exact
        matrix = torch.cat([torch.cat([cos, -signed], 1), torch.cat([signed, cos], 1)], 0)
        out = exact_matmul(matrix, signals, _F64)
        out_re.append(out[: len(cos)])
        out_im.append(out[len(cos) :])
    return _back(torch.cat(out_re), rest, dim), _back(torch.cat(out_im), rest, dim)


def real_dft(x: torch.Tensor, dim: int, onesided: bool, block=None):
    """The forward transform of the real float64 signals x along `dim`: (real, imaginary) parts
    in float64, outputs 0 .. n // 2 when `onesided`, else all n."""
    n = x.shape[dim]
    cols, rest = _columns(x, dim)
    out_re, out_im = [], []
    for cos, sin in _blocks(n, n // 2 + 1 if onesided else n, x.device, block):
        out = exact_matmul(torch.cat([cos, -sin], 0), cols, _F64)
        out_re.append(out[: len(cos)])
        out_im.append(out[len(cos) :])
    return _back(torch.cat(out_re), rest, dim), _back(torch.cat(out_im), rest, dim)


def hermitian_dft(re: torch.Tensor, im: torch.Tensor, dim: int, n: int, block=None):
    """The real signals of length n whose spectrum is the one-sided re + i im along `dim`
    (entries 0 .. n // 2; the rest by conjugate symmetry), transformed backward, unnormalised:
    y[j] = sum over k of c_k (re[k] cos - im[k] sin)(2 pi j k / n), c_k = 2 for the entries that
    stand for their mirrored partner too, else 1 (a doubling is exact). As FFT libraries do, the
    imaginary parts of entry 0 and (n even) n / 2 are not read."""
    half = n // 2 + 1
    re, im = _fit(re, dim, half), _fit(im, dim, half).clone()
    im.select(dim, 0).zero_()
    if n % 2 == 0:
        im.select(dim, n // 2).zero_()
    weight = torch.full((half,), 2.0, dtype=_F64, device=re.device)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    cols_re, rest = _columns(re, dim)
    cols_im, _ = _columns(im, dim)
    spectra = torch.cat([cols_re, cols_im], 0)
    out = []
    for cos, sin in _blocks(n, n, re.device, block):  # row j, column k: symmetric
        matrix = torch.cat([cos[:, :half] * weight, -(sin[:, :half] * weight)], 1)
        out.append(exact_matmul(matrix, spectra, _F64))
    return _back(torch.cat(out), rest, dim)


def _fit(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """x cut or padded with zeros to `size` entries along `dim`."""
    have = x.shape[dim]
    if have >= size:
        return x.narrow(dim, 0, size)
    shape = list(x.shape)
    shape[dim] = size - have
    return torch.cat([x, x.new_zeros(shape)], dim)
