"""The Fourier transforms under portable mode: every torch.fft function and stft runs under strict,
agrees with torch.fft to 1e-12 in float64 (forward and backward) and to float32's precision in
float32, normalises with one division, gives a row the bits it has alone, whatever the batch and
the thread count, and multiplies a complex tensor by a real number part by part."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableError, PortableMode
from twice.portable.ops import fft

G = torch.Generator().manual_seed(11)
F64, C128 = torch.float64, torch.complex128

REAL = torch.randn(3, 6, 10, dtype=F64, generator=G)
SPECTRUM = torch.randn(3, 6, 10, dtype=C128, generator=G)
# (function, input): real and complex inputs, one and several dimensions, every norm
CASES = [
    (lambda x: torch.fft.fft(x), REAL),
    (lambda x: torch.fft.fft(x, n=13, dim=1, norm="ortho"), SPECTRUM),
    (lambda x: torch.fft.ifft(x, norm="forward"), SPECTRUM),
    (lambda x: torch.fft.rfft(x, dim=0), REAL),
    (lambda x: torch.fft.irfft(x, n=9), SPECTRUM),
    (lambda x: torch.fft.irfft(x, norm="ortho"), SPECTRUM),
    (lambda x: torch.fft.hfft(x, n=7, norm="forward"), SPECTRUM),
    (lambda x: torch.fft.ihfft(x), REAL),
    (lambda x: torch.fft.fft2(x, norm="ortho"), SPECTRUM),
    (lambda x: torch.fft.ifftn(x, dim=(2, 0)), REAL),
    (lambda x: torch.fft.rfftn(x, s=(5, 8), dim=(0, 2)), REAL),
    (lambda x: torch.fft.irfft2(x, s=(6, 11)), SPECTRUM),
    (lambda x: torch.fft.hfftn(x), SPECTRUM),
    (lambda x: torch.fft.ihfft2(x, norm="ortho"), REAL),
    (
        lambda x: torch.stft(
            x.flatten(0, 1), 8, 3, window=torch.hann_window(8, dtype=x.dtype), return_complex=True
        ),
        REAL,
    ),
]


def _loss(out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A weighted sum of the output's parts."""
    return ((torch.view_as_real(out.resolve_conj()) if out.is_complex() else out) * weight).sum()


def _error(ours, reference) -> float:
    ours, reference = (
        torch.view_as_real(t.detach().resolve_conj().to(C128)) for t in (ours, reference)
    )
    return float((ours - reference).abs().max() / reference.abs().max())


@pytest.mark.parametrize("case", range(len(CASES)))
def test_values_and_gradients_agree_with_torch_to_1e12_in_float64(case):
    function, x = CASES[case]
    x = x.clone().requires_grad_(True)
    reference = function(x)
    parts = torch.view_as_real(reference.resolve_conj()) if reference.is_complex() else reference
    weight = torch.randn(parts.shape, dtype=F64, generator=G)  # drawn outside the mode
    (expected,) = torch.autograd.grad(_loss(reference, weight), [x])
    with PortableMode("strict"):
        ours = function(x)
        (grad,) = torch.autograd.grad(_loss(ours, weight), [x])
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    assert _error(ours, reference) < 1e-12
    assert _error(grad, expected) < 1e-12


@pytest.mark.parametrize("case", range(len(CASES)))
def test_float32_results_agree_with_torch_to_float32_precision(case):
    function, x = CASES[case]
    x = x.to(torch.complex64 if x.is_complex() else torch.float32)
    with PortableMode("strict"):
        ours = function(x)
    reference = function(x.to(C128 if x.is_complex() else F64))
    assert ours.dtype == function(x).dtype
    assert _error(ours, reference) < 1e-6


def test_norms_divide_the_float64_result_once():
    with PortableMode("strict"):
        plain = torch.fft.rfft(REAL)
        assert torch.equal(torch.fft.rfft(REAL, norm="forward"), plain / 10)
        assert torch.equal(
            torch.fft.fft2(SPECTRUM, norm="ortho"), torch.fft.fft2(SPECTRUM) / 60**0.5
        )


def test_a_rows_bits_do_not_depend_on_the_batch_or_the_thread_count():
    x = torch.randn(16, 40, dtype=torch.float32, generator=G) * torch.logspace(-6, 6, 16)[:, None]
    images = torch.randn(5, 12, 9, dtype=torch.complex64, generator=G)
    threads = torch.get_num_threads()
    try:
        with PortableMode("strict"):
            torch.set_num_threads(1)
            rows, planes = torch.fft.rfft(x), torch.fft.fft2(images)
            torch.set_num_threads(max(2, threads))
            assert torch.equal(torch.fft.rfft(x), rows)
            assert torch.equal(torch.fft.fft2(images), planes)
            for i in range(16):
                assert torch.equal(torch.fft.rfft(x[i : i + 1])[0], rows[i])
            for i in range(5):
                assert torch.equal(torch.fft.fft2(images[i]), planes[i])
    finally:
        torch.set_num_threads(threads)


def test_a_complex_tensor_times_a_real_one_is_multiplied_part_by_part():
    z = torch.randn(50, dtype=torch.complex64, generator=G)
    z[0] = complex(-0.0, float("inf"))
    ramp = torch.linspace(-2, 2, 50)
    with PortableMode("strict"):
        doubled, halved = z * 2.0, z.clone().mul_(0.5)
        scaled, swapped = z * ramp, 2 * z
        with pytest.raises(PortableError, match="complex arithmetic"):
            z * 1j
    assert torch.equal(torch.view_as_real(doubled), torch.view_as_real(z) * 2.0)
    assert torch.equal(torch.view_as_real(swapped), torch.view_as_real(doubled))
    assert torch.equal(torch.view_as_real(halved), torch.view_as_real(z) * 0.5)
    assert torch.equal(torch.view_as_real(scaled), torch.view_as_real(z) * ramp[:, None])
    assert fft.mul_real(z, 3).dtype == torch.complex64


def test_the_transforms_refuse_what_they_do_not_compute():
    with pytest.raises(fft.PortableUnsupported):
        fft.fft_r2c(torch.ones(4, dtype=torch.int64), [0], 0, True)


def test_polar_is_twices_cosine_and_sine_times_the_magnitude():
    from twice.portable.dispatch.mode import PortableMode

    g = torch.Generator().manual_seed(11)
    magnitude, angle = torch.rand(50, generator=g) * 3, (torch.rand(50, generator=g) - 0.5) * 20
    with PortableMode("strict"):
        ours = torch.polar(magnitude, angle)
        alone = torch.polar(magnitude[7:8], angle[7:8])
    theirs = torch.polar(magnitude.double(), angle.double())
    assert ours.dtype == torch.complex64 and torch.equal(ours[7:8], alone)
    assert bool(((ours.to(torch.complex128) - theirs).abs() <= 1e-6).all())
