"""The DFT as an exact product with twice's twiddle matrix: torch.fft's float64 values to 1e-12,
exact twiddles where the angle is a multiple of a quarter turn, and each signal's bits its own
alone, whatever else is in the batch."""

import math

import pytest
import torch

from twice.portable.arithmetic import dft

F64 = torch.float64
G = torch.Generator().manual_seed(5)


def _close(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest error relative to the reference's largest magnitude."""
    return float((ours - reference).abs().max() / reference.abs().max())


def test_twiddles_are_exact_at_quarter_turns_and_accurate_elsewhere():
    cos, sin = dft.twiddles(12, torch.device("cpu"))
    k = torch.arange(12, dtype=F64)
    angle = 2 * math.pi * ((k[:, None] * k[None, :]) % 12) / 12
    assert float((cos - torch.cos(angle)).abs().max()) < 1e-15
    assert float((sin - torch.sin(angle)).abs().max()) < 1e-15
    assert cos[0].eq(1).all() and sin[0].eq(0).all()
    assert (cos[1, 3], sin[1, 3], cos[1, 6], sin[1, 9]) == (0.0, 1.0, -1.0, -1.0)
    assert dft.twiddles(12, torch.device("cpu"))[0] is cos  # computed once per length


@pytest.mark.parametrize("n", [1, 2, 7, 8, 33])
@pytest.mark.parametrize("forward", [True, False])
def test_complex_dft_agrees_with_torch_in_float64(n, forward):
    re, im = torch.randn(3, n, 4, dtype=F64, generator=G), torch.randn(3, n, 4, dtype=F64)
    out_re, out_im = dft.complex_dft(re, im, 1, forward)
    signal = torch.complex(re, im)
    reference = torch.fft.fft(signal, dim=1) if forward else torch.fft.ifft(signal, dim=1) * n
    assert _close(torch.complex(out_re, out_im), reference) < 1e-13


@pytest.mark.parametrize("n", [1, 2, 9, 16])
def test_real_and_hermitian_dft_agree_with_torch_in_float64(n):
    x = torch.randn(5, n, dtype=F64, generator=G)
    re, im = dft.real_dft(x, 1, onesided=True)
    assert _close(torch.complex(re, im), torch.fft.rfft(x)) < 1e-13
    re, im = dft.real_dft(x, 1, onesided=False)
    assert _close(torch.complex(re, im), torch.fft.fft(x)) < 1e-13
    spectrum = torch.randn(5, n // 2 + 1, dtype=torch.complex128, generator=G)
    y = dft.hermitian_dft(spectrum.real, spectrum.imag, 1, n)
    assert _close(y, torch.fft.irfft(spectrum, n) * n) < 1e-13


def test_hermitian_dft_reads_neither_imaginary_part_of_its_real_entries():
    spectrum = torch.randn(4, 5, dtype=torch.complex128, generator=G)
    re, im = spectrum.real, spectrum.imag.clone()
    base = dft.hermitian_dft(re, im, 1, 8)
    im[:, 0], im[:, 4] = math.inf, math.nan  # entry 0 and 8 // 2
    assert torch.equal(dft.hermitian_dft(re, im, 1, 8), base)
    # a longer spectrum is cut to n // 2 + 1 entries, a shorter one padded with zeros
    assert torch.equal(dft.hermitian_dft(re, im, 1, 4), dft.hermitian_dft(re[:, :3], im, 1, 4))
    zero = torch.zeros(4, 1, dtype=F64)
    im = spectrum.imag
    padded = dft.hermitian_dft(torch.cat([re, zero], 1), torch.cat([im, zero], 1), 1, 11)
    assert torch.equal(dft.hermitian_dft(re, im, 1, 11), padded)


def test_a_signals_bits_do_not_depend_on_the_rest_of_the_batch():
    re = torch.randn(6, 24, dtype=F64, generator=G) * torch.logspace(-8, 8, 6, dtype=F64)[:, None]
    im = torch.randn(6, 24, dtype=F64, generator=G)
    batch = dft.complex_dft(re, im, 1, True)
    real = dft.real_dft(re, 1, True)
    for i in range(6):
        alone = dft.complex_dft(re[i : i + 1], im[i : i + 1], 1, True)
        assert torch.equal(alone[0][0], batch[0][i]) and torch.equal(alone[1][0], batch[1][i])
        assert torch.equal(dft.real_dft(re[i : i + 1], 1, True)[0][0], real[0][i])


def test_nonfinite_values_spread_as_ieee_arithmetic_does():
    x = torch.randn(3, 8, dtype=F64, generator=G)
    x[1, 2] = math.nan
    x[2, 5] = math.inf
    re, _ = dft.real_dft(x, 1, onesided=True)
    assert re[1].isnan().all() and not re[0].isnan().any()
    assert re[2, 0] == math.inf  # cos(0) inf: the sum is inf


def test_long_transforms_computed_in_blocks_of_rows_have_the_same_bits():
    x = torch.randn(2, 1100, dtype=F64, generator=G)
    y = torch.randn(2, 1100, dtype=F64, generator=G)
    whole = dft.complex_dft(x, y, 1, False)  # beyond the cached lengths: blocks of rows
    assert _close(torch.complex(*whole), torch.fft.ifft(torch.complex(x, y)) * 1100) < 1e-12
    small = dft.complex_dft(x, y, 1, False, block=1100 * 7)
    assert torch.equal(small[0], whole[0]) and torch.equal(small[1], whole[1])
    short = x[:, :40]
    for block in (40, 40 * 3):
        real = dft.real_dft(short, 1, True, block=block)
        assert torch.equal(real[0], dft.real_dft(short, 1, True)[0])
        assert torch.equal(real[1], dft.real_dft(short, 1, True)[1])
        back = dft.hermitian_dft(short[:, :21], y[:, :21], 1, 40, block=block)
        assert torch.equal(back, dft.hermitian_dft(short[:, :21], y[:, :21], 1, 40))
