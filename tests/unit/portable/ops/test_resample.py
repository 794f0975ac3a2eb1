"""ops/resample: interpolation (linear, bilinear, trilinear, bicubic, anti-aliased) and adaptive
average pooling as exact products with per-axis weight matrices."""

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.dispatch.table import KERNELS
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


def _two_d(name, x, size, align, scales):
    forward = getattr(torch.ops.aten, name).default
    backward = getattr(torch.ops.aten, f"{name}_backward").default
    return forward(x, size, align, *scales), lambda go: backward(go, size, x.shape, align, *scales)


def test_bicubic_and_anti_aliased_interpolation_match_torch_in_float64_both_ways():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, 9, generator=g, dtype=torch.float64)
    cases = [((11, 5), False, (None, None)), ((3, 4), True, (None, None))]
    cases += [((14, 18), False, (2.0, 2.0)), ((3, 20), False, (0.45, 2.3))]
    for name in ("upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"):
        for size, align, scales in cases:
            ref, ref_backward = _two_d(name, x, size, align, scales)
            ours = KERNELS[f"{name}.default"](x, size, align, *scales)
            assert torch.allclose(ours, ref, rtol=1e-13, atol=1e-13), (name, size, align)
            go = torch.randn(ref.shape, generator=g, dtype=torch.float64)
            mine = KERNELS[f"{name}_backward.default"](go, size, x.shape, align, *scales)
            assert torch.allclose(mine, ref_backward(go), rtol=1e-13, atol=1e-13)
    vec = KERNELS["_upsample_bilinear2d_aa.vec"](x, None, False, [0.45, 1.7])
    ref = torch.ops.aten._upsample_bilinear2d_aa.vec(x, None, False, [0.45, 1.7])
    assert torch.allclose(vec, ref, rtol=1e-13, atol=1e-13)


def test_trilinear_interpolation_matches_torch_and_a_samples_bits_do_not_depend_on_its_batch():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 4, 5, 6, generator=g) * torch.logspace(-4, 4, 3).reshape(-1, 1, 1, 1, 1)
    for size, align, scales in [((5, 3, 7), False, (None,) * 3), ((8, 10, 12), True, (2.0,) * 3)]:
        x64 = x.double()
        ref = torch.ops.aten.upsample_trilinear3d.default(x64, size, align, *scales)
        ours = KERNELS["upsample_trilinear3d.default"](x64, size, align, *scales)
        assert torch.allclose(ours, ref, rtol=1e-13, atol=1e-13)
        go = torch.randn(ref.shape, generator=g, dtype=torch.float64)
        backward = torch.ops.aten.upsample_trilinear3d_backward.default
        mine = KERNELS["upsample_trilinear3d_backward.default"](go, size, x.shape, align, *scales)
        assert torch.allclose(mine, backward(go, size, x.shape, align, *scales), atol=1e-13)
        whole = KERNELS["upsample_trilinear3d.default"](x, size, align, *scales)
        for i in range(3):
            alone = KERNELS["upsample_trilinear3d.default"](x[i : i + 1], size, align, *scales)
            assert torch.equal(alone, whole[i : i + 1])


def test_bicubic_interpolation_runs_under_the_mode_with_a_batch_independent_gradient():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 6, 5, generator=g) * torch.logspace(-4, 4, 3).reshape(-1, 1, 1, 1)
    x.requires_grad_(True)
    probe = torch.randn(3, 2, 9, 4, generator=g)
    with PortableMode("strict"):
        y = torch.nn.functional.interpolate(x, (9, 4), mode="bicubic", antialias=True)
        (grad,) = torch.autograd.grad((y * probe).sum(), x)
        (first,) = torch.autograd.grad(
            (
                torch.nn.functional.interpolate(x[:1], (9, 4), mode="bicubic", antialias=True)
                * probe[:1]
            ).sum(),
            x,
        )
    ref = torch.nn.functional.interpolate(x.double(), (9, 4), mode="bicubic", antialias=True)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-9)  # torch's float32: 3.5e-5
    assert torch.equal(first[:1], grad[:1])
