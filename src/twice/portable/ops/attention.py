"""Scaled dot-product attention under portable mode: the same bits whichever route torch takes.

`F.scaled_dot_product_attention` is one call with several implementations, and torch picks one
by device, dtype, shape and process-wide flags: FlashAttention (a fused CPU kernel, and CUDA's),
the memory-efficient and cuDNN kernels, or the math route, which is plain operations. Each
rounds differently, so the route would decide the bits. Portable mode settles it in two places:

- switches.py turns the fused routes off while the mode is active, so torch takes the math route
  on every device: `q * sqrt(scale)` times `k^T * sqrt(scale)`, the mask added, `_safe_softmax`,
  times `v`, each operation routed by the mode;
- a fused kernel reached anyway (a program that enters `sdpa_kernel(FLASH_ATTENTION)` itself)
  is a composite kernel here: it runs those same operations, and its backward runs the
  operations autograd runs over them, so its bits are the math route's.
"""

from __future__ import annotations

import math

import torch

from twice.portable.dispatch.table import PortableUnsupported, kernel

__all__ = ["attention", "attention_backward"]

_HALF = (torch.float16, torch.bfloat16)


def _roots(q: torch.Tensor, scale: float | None) -> tuple[float, float]:
    """The factors torch's math route scales q and k^T by: the square root of the scale
    (1/sqrt(E) where none is given), q's negated where the scale is negative."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if scale < 0:
        root = math.sqrt(-scale)
        return -root, root
    root = math.sqrt(scale)  # -0.0 for a scale of -0.0, as torch's
    return root, root


def _mask(attn_mask, is_causal, q, k, dtype):
    """The additive mask: a boolean one (or the causal one) as 0 where kept and -inf elsewhere."""
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=attn_mask.device)
    return torch.where(attn_mask, zero, torch.scalar_tensor(-math.inf, dtype=dtype))


def _groups(q, k):
    """How many query heads share each key and value head (grouped-query attention)."""
    heads, kv_heads = q.shape[-3] if q.dim() > 2 else 1, k.shape[-3] if k.dim() > 2 else 1
    return heads // kv_heads if kv_heads and heads != kv_heads else 1


def _repeat(t, groups):
    """Each key or value head for its group of query heads, as the math route repeats it."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=-3)


def _weights(q, k, attn_mask, is_causal, scale):
    """The math route's attention weights and the scaled operands they came from, computed in
    float32 for half-precision inputs as that route computes them."""
    k = _repeat(k, _groups(q, k))
    if q.dtype in _HALF:
        q, k = q.float(), k.float()
    for_q, for_k = _roots(q, scale)
    qs = q * for_q
    ks = k.transpose(-2, -1) * for_k
    scores = torch.matmul(qs, ks)
    mask = _mask(attn_mask, is_causal, q, k, q.dtype)
    if mask is not None:
        scores = scores + mask
    return torch._safe_softmax(scores, -1), scores, qs, ks, (for_q, for_k)


def _no_dropout(dropout_p):
    if dropout_p:  # its mask would be drawn again in the backward: no such recomputation
        raise PortableUnsupported("a fused attention kernel with dropout (the math route has it)")


@kernel("_scaled_dot_product_flash_attention_for_cpu.default", composite=True)
def attention(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """The math route's output, and the log-sum-exp of the scaled scores (FlashAttention's
    second output, float32)."""
    _no_dropout(dropout_p)
    attn, scores, _, _, _ = _weights(q, k, attn_mask, is_causal, scale)
    value = _repeat(v.float() if v.dtype in _HALF else v, _groups(q, k))
    out = torch.matmul(attn, value).to(q.dtype)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return out, torch.logsumexp(scores, -1).to(lse_dtype)


@kernel("_scaled_dot_product_flash_attention_for_cpu_backward.default", composite=True)
def attention_backward(go, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None,
                       scale=None):  # fmt: skip
    """The gradients autograd computes through the math route: of `attn @ v`, of
    `_safe_softmax` (from its output), of `qs @ ks` and of the two scalings."""
    _no_dropout(dropout_p)
    groups = _groups(q, k)
    attn, _, qs, ks, (for_q, for_k) = _weights(q, k, attn_mask, is_causal, scale)
    value = _repeat(v.float() if v.dtype in _HALF else v, groups)
    grad = go.float() if go.dtype in _HALF else go
    grad_attn = torch.matmul(grad, value.transpose(-2, -1))
    grad_v = torch.matmul(attn.transpose(-2, -1), grad)
    grad_scores = torch._softmax_backward_data(grad_attn, attn, -1, attn.dtype)
    grad_qs = torch.matmul(grad_scores, ks.transpose(-2, -1))
    grad_ks = torch.matmul(qs.transpose(-2, -1), grad_scores)
    grad_k = _fold(grad_ks * for_k, groups).transpose(-2, -1)
    grad_q = grad_qs * for_q
    grad_v = _fold(grad_v, groups)
    return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype)


def _fold(grad, groups):
    """The gradient of `_repeat` (on a tensor whose heads are dimension -3): each group's heads
    summed, as autograd sums an expanded dimension."""
    if groups == 1:
        return grad
    shape = grad.shape
    grouped = grad.reshape(*shape[:-3], shape[-3] // groups, groups, *shape[-2:])
    return grouped.sum(-3)
