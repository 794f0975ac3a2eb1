"""Portable kernels for the network operations (nn.py) and the random operations (philox.py),
registered in table.KERNELS by aten overload name."""

from __future__ import annotations

import math

import torch

from twice.portable import elementwise as ew
from twice.portable import nn, norms, philox
from twice.portable.exact import exact_matmul, exact_sum
from twice.portable.ops_math import floating
from twice.portable.table import PortableUnsupported, kernel

__all__ = ["attention", "attention_backward"]

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
kernel("convolution.default")(_guard(nn.convolution))
kernel("convolution_backward.default")(_guard(nn.convolution_backward))
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


def _scores(q, k, attn_mask, is_causal, scale):
    s = exact_matmul(q, k.transpose(-2, -1), _F64, q.dtype) * scale
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, -math.inf)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask
    return s


def _lse(s, like):
    top = s.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    return top + ew.log(exact_sum(ew.exp(s - top), (-1,), True, _F64, like))


@kernel("_scaled_dot_product_flash_attention_for_cpu.default")
def attention(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """softmax(q k^T * scale) v, exactly, with the log-sum-exp the backward reads."""
    floating(q, k, v)
    if dropout_p:
        raise PortableUnsupported("attention with dropout in the fused CPU kernel")
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = _scores(q, k, attn_mask, is_causal, scale)
    lse = _lse(s, q.dtype)
    out = exact_matmul(ew.exp(s - lse), v.to(_F64), q.dtype)
    return out, lse.squeeze(-1).to(torch.float32)


@kernel("_scaled_dot_product_flash_attention_for_cpu_backward.default")
def attention_backward(go, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    """The gradients of `attention` (the FlashAttention recurrences, computed exactly)."""
    floating(go, q, k, v)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    p = ew.exp(_scores(q, k, attn_mask, is_causal, scale) - lse.to(_F64).unsqueeze(-1))
    g64 = go.to(_F64)
    gv = exact_matmul(p.transpose(-2, -1), g64, v.dtype)
    gp = exact_matmul(g64, v.to(_F64).transpose(-2, -1), _F64, go.dtype)
    row = exact_sum(g64 * out.to(_F64), (-1,), True, _F64, go.dtype)
    ds = p * (gp - row) * scale
    gq = exact_matmul(ds, k.to(_F64), q.dtype)
    gk = exact_matmul(ds.transpose(-2, -1), q.to(_F64), k.dtype)
    return gq, gk, gv


# Random operations: one key from torch's generator per call, Philox for the elements.


def _fill(self, values):
    self.copy_(values.reshape(self.shape).to(self.dtype))
    return self


@kernel("uniform_.default")
def _uniform_(self, from_=0.0, to=1.0, *, generator=None):
    floating(self)
    u = philox.uniform(self.numel(), philox.draw_key(generator), self.device)
    return _fill(self, u * (float(to) - float(from_)) + float(from_))


@kernel("normal_.default")
def _normal_(self, mean=0.0, std=1.0, *, generator=None):
    floating(self)
    n = philox.normal(self.numel(), philox.draw_key(generator), self.device)
    return _fill(self, n * float(std) + float(mean))


def _coins(shape, p, generator, device):
    u = philox.uniform(math.prod(shape), philox.draw_key(generator), device).reshape(shape)
    return u < (p.to(_F64) if isinstance(p, torch.Tensor) else float(p))


@kernel("bernoulli_.float", "bernoulli_.Tensor")
def _bernoulli_(self, p=0.5, *, generator=None):
    floating(self)
    return _fill(self, _coins(self.shape, p, generator, self.device))


@kernel("bernoulli.default")
def _bernoulli(x, *, generator=None):
    floating(x)
    return _coins(x.shape, x, generator, x.device).to(x.dtype)


@kernel("bernoulli.p")
def _bernoulli_p(x, p, *, generator=None):
    floating(x)
    return _coins(x.shape, p, generator, x.device).to(x.dtype)


@kernel("native_dropout.default")
def _native_dropout(x, p, train):
    floating(x)
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    mask = _coins(x.shape, 1.0 - p, None, x.device)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return torch.mul(torch.mul(x, mask), scale), mask


def _factory(values, size, dtype, device):
    dtype = dtype or torch.get_default_dtype()
    return values.reshape(tuple(size)).to(dtype=dtype, device=device)


@kernel("rand.default", "rand.generator")
def _rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    u = philox.uniform(math.prod(size), philox.draw_key(generator), device)
    return _factory(u, size, dtype, device)


@kernel("randn.default", "randn.generator")
def _randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    n = philox.normal(math.prod(size), philox.draw_key(generator), device)
    return _factory(n, size, dtype, device)


def _integers(count, low, high, generator, device):
    if high <= low:
        raise PortableUnsupported(f"random integers from an empty range [{low}, {high})")
    words = philox.integers(count, philox.draw_key(generator), device)
    return low + torch.remainder(words, high - low)


@kernel("randint.default", "randint.generator")
def _randint(high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    values = _integers(math.prod(size), 0, high, generator, device)
    return values.reshape(tuple(size)).to(dtype=dtype or torch.int64, device=device)


@kernel("randint.low", "randint.low_generator")
def _randint_low(
    low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None
):
    values = _integers(math.prod(size), low, high, generator, device)
    return values.reshape(tuple(size)).to(dtype=dtype or torch.int64, device=device)


@kernel("randperm.default", "randperm.generator")
def _randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    perm = philox.randperm(n, philox.draw_key(generator), device)
    return perm.to(dtype=dtype or torch.int64, device=device)


@kernel("random_.default", "random_.from", "random_.to")
def _random_(self, *args, generator=None):
    low, high = (0, args[0]) if len(args) == 1 else (args[0], args[1]) if args else (0, None)
    if high is None:
        high = (
            2**24 + 1 if self.dtype == torch.float32 else 2**53 + 1 if self.dtype == _F64 else None
        )
        high = high or (2**63 - 1 if self.dtype == torch.int64 else torch.iinfo(self.dtype).max + 1)
    return _fill(self, _integers(self.numel(), low, high, generator, self.device))
