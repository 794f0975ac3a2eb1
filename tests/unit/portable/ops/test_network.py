"""ops/network: the network operations registered by their aten names (softmax, the losses, the
norms, convolution, attention): a layer under portable mode runs them."""

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.dispatch.table import KERNELS
from twice.portable.ops import network


def test_attention_runs_portable_operations_with_its_backward():
    assert KERNELS["mse_loss.default"].__module__ == network.__name__
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, requires_grad=True) for _ in range(3))
    with PortableMode("strict") as mode:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out, plain, atol=1e-6) and not mode.uncovered
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


def test_the_mean_squared_error_and_its_gradient_match_torch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(6, 4, generator=g, dtype=torch.float64)
    with PortableMode("strict"):
        loss = torch.nn.functional.mse_loss(x, t)
        (grad,) = torch.autograd.grad(loss, x)
    assert torch.allclose(loss, ((x - t) ** 2).mean(), rtol=1e-14)
    assert torch.allclose(grad, 2 * (x - t).detach() / x.numel(), rtol=1e-14)
