"""ops/norms: the normalisation layers, as accurate as torch in float64."""

import torch

from twice.portable.ops import norms
from unit.portable.bits import (
    F64,
    gen,
)


def test_layer_norm_matches_torch_in_float64():
    g = gen(6)
    x = torch.randn(4, 7, generator=g, dtype=F64)
    close = {"rtol": 1e-12, "atol": 1e-12}
    out, *_ = norms.layer_norm(x, [7], None, None, 1e-5)
    assert torch.allclose(out, torch.nn.functional.layer_norm(x, [7]), **close)


def test_group_norm_of_no_sample_is_empty_and_its_parameter_gradients_zero():
    x, w = torch.zeros(0, 4, 3), torch.randn(4)
    out, mean, rstd = norms.group_norm(x, w, w, 0, 4, 3, 2, 1e-5)
    expected = torch.ops.aten.native_group_norm(x, w, w, 0, 4, 3, 2, 1e-5)
    assert [t.shape for t in (out, mean, rstd)] == [t.shape for t in expected]
    grads = norms.group_norm_backward(x, x, mean, rstd, w, 0, 4, 3, 2, [True, True, True])
    theirs = torch.ops.aten.native_group_norm_backward(x, x, mean, rstd, w, 0, 4, 3, 2, [True] * 3)
    assert all(torch.equal(a, b) for a, b in zip(grads, theirs))


def test_group_norm_of_empty_planes_gives_torchs_statistics():
    """Samples whose planes hold no element: torch's statistics of nothing, with or without a
    weight (the mode's empty-operand rule takes the call without one)."""
    x, w = torch.zeros(2, 4, 0), torch.randn(4)
    for weight in (w, None):
        found = norms.group_norm(x, weight, weight, 2, 4, 0, 2, 1e-5)
        expected = torch.ops.aten.native_group_norm(x, weight, weight, 2, 4, 0, 2, 1e-5)
        assert all(
            torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(found, expected)
        )
