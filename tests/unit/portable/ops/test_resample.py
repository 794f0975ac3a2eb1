"""ops/resample: bilinear interpolation and adaptive average pooling as exact products with
per-axis weight matrices."""

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import resample


def test_the_weight_matrices_place_sources_as_torch_does():
    pooled = resample.adaptive_weights(5, 3)
    assert pooled.tolist() == [
        [0.5, 0.5, 0.0, 0.0, 0.0],
        [0.0, 1 / 3, 1 / 3, 1 / 3, 0.0],
        [0.0, 0.0, 0.0, 0.5, 0.5],
    ]
    aligned = resample.linear_weights(3, 5, True, None)
    assert aligned[:, 0].tolist() == [1.0, 0.5, 0.0, 0.0, 0.0]
    assert torch.equal(aligned.sum(1), torch.ones(5, dtype=torch.float64))
    x = torch.arange(4.0, dtype=torch.float64).reshape(1, 1, 4)
    for align in (False, True):
        theirs = torch.nn.functional.interpolate(x, 7, mode="linear", align_corners=align)
        ours = resample.linear_weights(4, 7, align, None) @ x[0, 0]
        assert torch.allclose(ours, theirs[0, 0], atol=1e-12)


def test_interpolation_and_adaptive_pooling_match_torch_and_their_backwards_are_adjoint():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 9, generator=g, requires_grad=True)
    with PortableMode("strict"):
        up = torch.nn.functional.interpolate(x, (11, 5), mode="bilinear", align_corners=False)
        pooled = torch.nn.functional.adaptive_avg_pool2d(x, (3, 4))
        probe = torch.randn(up.shape, generator=g)
        (grad,) = torch.autograd.grad((up * probe).sum(), x)
    plain = torch.nn.functional.interpolate(x, (11, 5), mode="bilinear", align_corners=False)
    assert torch.allclose(up, plain, atol=1e-5)
    assert torch.allclose(pooled, torch.nn.functional.adaptive_avg_pool2d(x, (3, 4)), atol=1e-6)
    # <up(x), probe> = <x, up^T(probe)>
    assert torch.allclose((up * probe).sum(), (x * grad).sum(), rtol=1e-5)
