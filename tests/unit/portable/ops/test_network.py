"""ops/network: the network operations registered by their aten names (softmax, the losses, the
norms, convolution, attention): a layer under portable mode runs them."""

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.dispatch.table import KERNELS
from twice.portable.ops import network
from unit.portable.bits import same_bits


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


def test_logsigmoid_recomputes_its_buffer_on_every_device():
    """On a CPU torch's backward reads exp(-|x|) rounded to x's dtype from the forward's
    buffer; on a GPU it recomputes it in float32: under the mode every device recomputes it,
    so a half-precision gradient is the GPU's here, emulated by torch's own decompositions. The
    buffer is still kept, so a backward outside the mode runs too."""
    import importlib

    decompositions = importlib.import_module("torch._decomp.decompositions")
    g = torch.Generator().manual_seed(2)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = (torch.randn(4096, generator=g) * 8).to(dtype)
        grad = torch.randn(4096, generator=g).to(dtype)
        leaf = x.clone().requires_grad_()
        with PortableMode("strict"):
            out = torch.nn.functional.logsigmoid(leaf)
            (dx,) = torch.autograd.grad(out, leaf, grad)
            gpu_out = decompositions.log_sigmoid_forward(x)[0]
            gpu_dx = decompositions.log_sigmoid_backward(grad, x, x.new_zeros((0,)))
            outside = torch.nn.functional.logsigmoid(leaf)
        assert same_bits(out, gpu_out) and same_bits(dx, gpu_dx), dtype
        torch.autograd.grad(outside, leaf, grad)  # torch's backward reads the kept buffer


def test_addmm_activation_is_addmm_then_the_exact_activation_on_every_device():
    g = torch.Generator().manual_seed(3)
    bias, a, b = torch.randn(5, generator=g), torch.randn(4, 6, generator=g), torch.randn(6, 5)
    with PortableMode("strict") as mode:
        for use_gelu, act in ((True, torch.nn.functional.gelu), (False, torch.relu)):
            fused = torch._addmm_activation(bias, a, b, beta=0.5, alpha=2.0, use_gelu=use_gelu)
            assert same_bits(fused, act(torch.addmm(bias, a, b, beta=0.5, alpha=2.0)))
    assert not mode.uncovered
