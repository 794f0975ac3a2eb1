"""ops/nn: softmax and the losses, as accurate as torch in float64."""

import torch

from twice.portable.ops import nn as pnn
from unit.portable.bits import (
    F64,
    gen,
)


def test_softmax_and_the_losses_match_torch_in_float64():
    g = gen(6)
    x = torch.randn(4, 7, generator=g, dtype=F64)
    close = {"rtol": 1e-12, "atol": 1e-12}
    assert torch.allclose(pnn.softmax(x, 1), torch.softmax(x, 1), **close)
    assert torch.allclose(pnn.log_softmax(x, 1), torch.log_softmax(x, 1), **close)
    target = torch.tensor([0, 3, 6, 2])
    loss, _ = pnn.nll_loss(torch.log_softmax(x, 1), target, None, 1, -100)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(x, target), **close)
