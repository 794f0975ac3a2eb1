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
