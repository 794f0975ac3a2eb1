"""Portable kernels for the network operations (nn.py) and the random operations (philox.py),
registered in table.KERNELS by aten overload name."""

from __future__ import annotations

import importlib

import torch

from twice.portable.arithmetic.exact import exact_sum
from twice.portable.dispatch.table import PortableUnsupported, kernel
from twice.portable.ops import conv, nn, norms
from twice.portable.ops.math import floating

__all__: list[str] = []

_F64 = torch.float64


def _guard(function):
    def run(*args, **kwargs):
        floating(*args)
        try:
            return function(*args, **kwargs)
        except nn.Unsupported as exc:
            raise PortableUnsupported(str(exc)) from None

    return run


kernel("_softmax.default")(_guard(lambda x, dim, half=False: nn.softmax(x, dim)))
kernel("_safe_softmax.default")(_guard(lambda x, dim, dtype=None: nn.softmax(x, dim, safe=True)))
kernel("_softmax_backward_data.default")(
    _guard(lambda g, y, dim, dtype: nn.softmax_backward(g, y, dim))
)
kernel("_log_softmax.default")(_guard(lambda x, dim, half=False: nn.log_softmax(x, dim)))
kernel("_log_softmax_backward_data.default")(
    _guard(lambda g, y, dim, dtype: nn.log_softmax_backward(g, y, dim))
)
kernel("nll_loss_forward.default")(_guard(nn.nll_loss))
kernel("nll_loss_backward.default")(_guard(nn.nll_loss_backward))
kernel("native_layer_norm.default")(_guard(norms.layer_norm))
kernel("native_layer_norm_backward.default")(_guard(norms.layer_norm_backward))
kernel("native_batch_norm.default")(_guard(norms.batch_norm))
kernel("native_batch_norm_backward.default")(_guard(norms.batch_norm_backward))
kernel("native_group_norm.default")(_guard(norms.group_norm))
kernel("native_group_norm_backward.default")(_guard(norms.group_norm_backward))
kernel("convolution.default")(_guard(conv.convolution))
kernel("convolution_backward.default")(_guard(conv.convolution_backward))
kernel("embedding_dense_backward.default")(_guard(nn.embedding_backward))


@kernel("_native_batch_norm_legit.default")
def _bn_legit(x, w, b, rm, rv, training, momentum, eps):
    return _guard(norms.batch_norm)(x, w, b, rm, rv, training, momentum, eps)


@kernel("_native_batch_norm_legit_no_training.default")
def _bn_eval(x, w, b, rm, rv, momentum, eps):
    return _guard(norms.batch_norm)(x, w, b, rm, rv, False, momentum, eps)


@kernel("nll_loss2d_forward.default")
def _nll2d(x, target, weight, reduction, ignore_index):
    flat = x.movedim(1, -1).reshape(-1, x.shape[1])
    loss, total = nn.nll_loss(flat, target.reshape(-1), weight, reduction, ignore_index)
    return (loss.reshape(target.shape) if reduction == 0 else loss), total


@kernel("nll_loss2d_backward.default")
def _nll2d_backward(grad, x, target, weight, reduction, ignore_index, total):
    flat = x.movedim(1, -1).reshape(-1, x.shape[1])
    g = grad.reshape(-1) if reduction == 0 else grad
    out = nn.nll_loss_backward(g, flat, target.reshape(-1), weight, reduction, ignore_index, total)
    return out.reshape(*x.shape[:1], *x.shape[2:], x.shape[1]).movedim(-1, 1)


@kernel("mse_loss.default")
def _mse(x, target, reduction=1):
    floating(x, target)
    d = x.to(_F64) - target.to(_F64)
    sq = d * d
    if reduction == 0:
        return sq.to(x.dtype)
    total = exact_sum(sq, None, False, _F64, x.dtype)
    return (total / sq.numel() if reduction == 1 else total).to(x.dtype)


@kernel("mse_loss_backward.default")
def _mse_backward(grad, x, target, reduction):
    norm = 2.0 / x.numel() if reduction == 1 else 2.0
    d = x.to(_F64) - target.to(_F64)
    return ((d * norm) * grad.to(_F64)).to(x.dtype)


@kernel("log_sigmoid_forward.default", composite=True)
def _log_sigmoid_forward(x):
    """torch's decomposition, and the buffer a CPU keeps (exp(-|x|) in x's dtype), whatever the
    device: torch's own backward reads it outside the mode. The mode's backward does not (see
    `_log_sigmoid_backward`)."""
    decompositions = importlib.import_module("torch._decomp.decompositions")
    out, buffer = decompositions.log_sigmoid_forward(x)
    if buffer.numel() != x.numel():  # off a CPU the decomposition keeps none: the same one
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        buffer = torch.exp(-torch.abs(wide)).to(x.dtype)
    return out, buffer


@kernel("log_sigmoid_backward.default", composite=True)
def _log_sigmoid_backward(grad, x, buffer):
    """torch's decomposition as a GPU runs it: exp(-|x|) recomputed in float32 for half
    precision, where a CPU's reads the buffer rounded to it, so a gradient would follow the
    device."""
    decompositions = importlib.import_module("torch._decomp.decompositions")
    return decompositions.log_sigmoid_backward(grad, x, x.new_zeros((0,)))


@kernel("_addmm_activation.default", composite=True)
def _addmm_activation(self, mat1, mat2, beta=1, alpha=1, use_gelu=False):
    """addmm then relu or GELU, computed in float32 for half-precision operands as torch's
    decomposition computes it; GELU is the exact one on every device (the decomposition takes
    tanh's approximation on a GPU, as cuBLAS's fused epilogue does)."""
    wide = self.dtype in (torch.float16, torch.bfloat16)
    operands = [t.float() if wide else t for t in (self, mat1, mat2)]
    out = torch.addmm(*operands, beta=beta, alpha=alpha)
    out = torch.nn.functional.gelu(out) if use_gelu else torch.relu(out)
    return out.to(self.dtype)


@kernel("log_sigmoid_forward.output", composite=True)
def _log_sigmoid_forward_out(x, *, output, buffer):
    out, kept = _log_sigmoid_forward(x)
    output.resize_(out.shape).copy_(out)
    return output, buffer.resize_(kept.shape).copy_(kept)
