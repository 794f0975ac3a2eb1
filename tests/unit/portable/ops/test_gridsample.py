"""ops/gridsample: grid sampling in every mode, padding and corner rule as torch computes it in
float64, forward and backward, with a sample's bits independent of its batch."""

import itertools

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.dispatch.table import PortableUnsupported
from twice.portable.ops import gridsample
from unit.portable.bits import F64, gen, same_bits

aten = torch.ops.aten


def _case(d, dtype, seed=0):
    g = gen(seed)
    x = torch.randn(3, 2, *((5, 6) if d == 2 else (4, 5, 3)), generator=g, dtype=dtype)
    points = (4, 7) if d == 2 else (3, 4, 2)
    grid = torch.rand(3, *points, d, generator=g, dtype=dtype) * 2.6 - 1.3  # some outside
    grid[0, 0, 0] = 0.0  # on the centre; with aligned corners, on an input
    grid[0, 0, 1] = 1.0
    return x, grid


@pytest.mark.parametrize("d", [2, 3])
def test_grid_sampling_and_its_gradients_match_torch_in_float64(d):
    x, grid = _case(d, F64)
    forward = getattr(aten, f"grid_sampler_{d}d").default
    backward = getattr(aten, f"grid_sampler_{d}d_backward").default
    for mode, padding, align in itertools.product((0, 1, 2), (0, 1, 2), (False, True)):
        if d == 3 and mode == 2:
            continue
        ours = gridsample.grid_sample(x, grid, mode, padding, align)
        ref = forward(x, grid, mode, padding, align)
        assert torch.allclose(ours, ref, rtol=1e-12, atol=1e-12), (mode, padding, align)
        go = torch.randn(ref.shape, generator=gen(1), dtype=F64)
        mine = gridsample.grid_sample_backward(go, x, grid, mode, padding, align, [True, True])
        theirs = backward(go, x, grid, mode, padding, align, [True, True])
        for a, b in zip(mine, theirs):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), (mode, padding, align)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_a_samples_grid_sampling_has_the_same_bits_in_any_batch(mode):
    x, grid = _case(2, torch.float32, seed=2)
    x = x * torch.logspace(-4, 4, 3).reshape(-1, 1, 1, 1)
    go = torch.randn(3, 2, 4, 7, generator=gen(3))
    out = gridsample.grid_sample(x, grid, mode, 2, False)
    grads = gridsample.grid_sample_backward(go, x, grid, mode, 2, False, [True, True])
    for i in range(3):
        part = slice(i, i + 1)
        assert same_bits(gridsample.grid_sample(x[part], grid[part], mode, 2, False), out[part])
        alone = gridsample.grid_sample_backward(
            go[part], x[part], grid[part], mode, 2, False, [True, True]
        )
        for a, b in zip(alone, grads):
            assert same_bits(a, b[part])


def test_grid_sample_runs_under_the_mode_and_refuses_bicubic_3d():
    x, grid = _case(2, torch.float32, seed=4)
    x.requires_grad_(True)
    grid.requires_grad_(True)
    with PortableMode("strict"):
        y = torch.nn.functional.grid_sample(x, grid, mode="bicubic", align_corners=False)
        gx, gg = torch.autograd.grad(y.square().sum(), (x, grid))
    ref = torch.nn.functional.grid_sample(x, grid, mode="bicubic", align_corners=False)
    plain = torch.autograd.grad(ref.square().sum(), (x, grid))
    assert torch.allclose(y, ref, atol=1e-5)
    assert torch.allclose(gx, plain[0], atol=1e-4) and torch.allclose(gg, plain[1], atol=1e-3)
    x3, grid3 = _case(3, torch.float32)
    with pytest.raises(PortableUnsupported):
        gridsample.grid_sample(x3, grid3, 2, 0, False)
