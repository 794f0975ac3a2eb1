"""ops/transposed_conv: transposed convolutions, 1-d to 3-d, as the input gradient of the
ordinary one, match torch in float64; and every convolution of an empty batch runs."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import conv as pconv
from twice.portable.ops import transposed_conv
from unit.portable.bits import F64, gen

aten = torch.ops.aten


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_transposed_convolutions_and_their_gradients_match_torch_in_float64(spatial):
    assert transposed_conv.forward.__module__ == transposed_conv.__name__
    g = gen(20 + spatial)
    x = torch.randn(2, 4, *[5] * spatial, generator=g, dtype=F64)
    w = torch.randn(4, 3, *[3] * spatial, generator=g, dtype=F64)
    b = torch.randn(6, generator=g, dtype=F64)
    settings = ([2] * spatial, [1] * spatial, [1] * spatial, True, [1] * spatial, 2)
    out = pconv.convolution(x, w, b, *settings)
    ref = aten.convolution(x, w, b, *settings)
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    go = torch.randn(ref.shape, generator=g, dtype=F64)
    mask = [True, True, True]
    for mine, theirs in zip(
        pconv.convolution_backward(go, x, w, [6], *settings, mask),
        aten.convolution_backward(go, x, w, [6], *settings, mask),
    ):
        assert torch.allclose(mine, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spatial", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_convolution_of_an_empty_batch_gives_torchs_shapes_and_zero_gradients(
    spatial, transposed
):
    layer = (
        [torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d]
        if transposed
        else [torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d]
    )[spatial - 1](3, 4, 3, padding=1)
    x = torch.zeros(0, 3, *[5] * spatial, requires_grad=True)
    with PortableMode("strict"):
        y = layer(x)
        y.sum().backward()
    assert y.shape == layer(x).shape
    assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
    assert torch.equal(layer.bias.grad, torch.zeros_like(layer.bias))
