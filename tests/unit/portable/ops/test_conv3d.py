"""ops/conv3d: 3-d convolutions, ordinary and transposed, as accurate as torch in float64, with
a sample's bits independent of its batch and of the chunk of samples unfolded at once."""

import math

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import conv as pconv
from twice.portable.ops import conv3d
from unit.portable.bits import F64, gen, same_bits

CLOSE = {"rtol": 1e-12, "atol": 1e-12}
aten = torch.ops.aten


@pytest.mark.parametrize("transposed", [False, True])
def test_3d_convolutions_and_their_gradients_match_torch_in_float64(transposed):
    g = gen(3)
    x = torch.randn(2, 4, 6, 7, 5, generator=g, dtype=F64)
    shape = (4, 3, 2, 3, 2) if transposed else (6, 2, 2, 3, 2)
    w = torch.randn(shape, generator=g, dtype=F64)
    b = torch.randn(6, generator=g, dtype=F64)
    settings = (
        [2, 1, 1],
        [1, 0, 2],
        [1, 2, 1],
        transposed,
        [1, 1, 0] if transposed else [0] * 3,
        2,
    )
    ours = pconv.convolution(x, w, b, *settings)
    ref = aten.convolution(x, w, b, *settings)
    assert torch.allclose(ours, ref, **CLOSE)
    go = torch.randn(ref.shape, generator=g, dtype=F64)
    grads = pconv.convolution_backward(go, x, w, [6], *settings, [True, True, True])
    expected = aten.convolution_backward(go, x, w, [6], *settings, [True, True, True])
    for mine, theirs in zip(grads, expected):
        assert torch.allclose(mine, theirs, **CLOSE)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_samples_3d_convolution_has_the_same_bits_in_any_batch_and_chunk(monkeypatch, transposed):
    g = gen(4)
    scales = torch.logspace(-3, 3, 5).reshape(-1, 1, 1, 1, 1)
    x = torch.randn(5, 3, 5, 4, 6, generator=g) * scales
    w = torch.randn((3, 2, 3, 2, 2) if transposed else (4, 3, 3, 2, 2), generator=g)
    settings = ([1, 2, 1], [1, 1, 0], [1, 1, 2], transposed, [0, 1, 0] if transposed else [0] * 3)
    whole = pconv.convolution(x, w, None, *settings, 1)
    go = torch.randn(whole.shape, generator=g)
    grad_whole = pconv.convolution_backward(go, x, w, None, *settings, 1, [True, False, False])[0]
    for i in (0, 3):
        alone = pconv.convolution(x[i : i + 1], w, None, *settings, 1)
        assert same_bits(alone, whole[i : i + 1])
        grad = pconv.convolution_backward(
            go[i : i + 1], x[i : i + 1], w, None, *settings, 1, [True, False, False]
        )[0]
        assert same_bits(grad, grad_whole[i : i + 1])
    monkeypatch.setattr(conv3d, "COLUMN_CHUNK", 7)  # one sample's columns at a time
    assert same_bits(pconv.convolution(x, w, None, *settings, 1), whole)
    again = pconv.convolution_backward(go, x, w, None, *settings, 1, [True, False, False])[0]
    assert same_bits(again, grad_whole)


def test_a_3d_convolution_keeps_ieee_non_finite_values_and_runs_under_the_mode():
    g = gen(5)
    x = torch.randn(2, 2, 4, 4, 4, generator=g, requires_grad=True)
    w = torch.randn(3, 2, 2, 2, 2, generator=g, requires_grad=True)
    with PortableMode("strict"):
        y = torch.nn.functional.conv3d(x, w, padding=1)
        gx, gw = torch.autograd.grad(y.square().sum(), (x, w))
        t = torch.nn.functional.conv_transpose3d(x, w.transpose(0, 1), stride=2)
    assert torch.allclose(y, torch.nn.functional.conv3d(x, w, padding=1), atol=1e-5)
    plain = torch.autograd.grad(torch.nn.functional.conv3d(x, w, padding=1).square().sum(), (x, w))
    assert torch.allclose(gx, plain[0], rtol=1e-4, atol=1e-4)
    assert torch.allclose(gw, plain[1], rtol=1e-4, atol=1e-4)
    ref = torch.nn.functional.conv_transpose3d(x, w.transpose(0, 1), stride=2)
    assert torch.allclose(t, ref, atol=1e-5)
    spoiled = x.detach().clone()
    spoiled[0, 0, 1, 1, 1] = math.inf
    out = pconv.convolution(spoiled, w.detach(), None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1)
    ref = torch.nn.functional.conv3d(spoiled, w.detach())
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert torch.allclose(out[1], ref[1], atol=1e-5)
