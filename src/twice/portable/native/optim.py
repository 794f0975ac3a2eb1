"""The optimizer step in one compiled pass (csrc/optim.c): `p_adam`."""

from __future__ import annotations

import torch

from twice.portable import native

__all__ = ["adam", "applies"]


def _apart(tensors) -> bool:
    """Whether no two of the tensors share memory (a step reads each element before it writes
    it, but a shared buffer would be read after another tensor's write)."""
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel()
    )
    return all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def applies(param, grad, exp_avg, exp_avg_sq) -> bool:
    """Whether `adam` can take these tensors: the compiled kernels in use, plain CPU tensors of
    one dtype (float32 or float64), one shape, contiguous, none sharing memory with another,
    none a ZeroTensor (no memory) or an inference tensor (torch refuses to update it)."""
    tensors = (param, grad, exp_avg, exp_avg_sq)
    if not native.usable(*tensors) or any(type(t) not in _PLAIN for t in tensors):
        return False
    if any(t._is_zerotensor() or t.is_inference() for t in tensors):
        return False
    if any(
        t.dtype != param.dtype or t.shape != param.shape or not t.is_contiguous() for t in tensors
    ):
        return False
    return _apart(tensors)


def adam(param, grad, exp_avg, exp_avg_sq, *, decay, decay_value, lerp_weight, beta2,
         one_minus_beta2, bc2_sqrt, eps, neg_step, versions=True) -> None:  # fmt: skip
    """One parameter's step of single-tensor Adam in place, on tensors `applies` takes (see
    csrc/optim.c for the steps and the scalars). With `versions`, each tensor's version counter
    goes up as torch's in-place operations would move it (param once, twice with decoupled
    decay; exp_avg once; exp_avg_sq twice), so autograd still refuses a graph that saved one of
    them; without (the fused kernel's step, which moves none), they stay."""
    buffer = native.buffer
    native.module().p_adam(
        param=buffer(param), grad=buffer(grad), exp_avg=buffer(exp_avg),
        exp_avg_sq=buffer(exp_avg_sq), decay=decay,
        decay_value=float(decay_value), lerp_weight=float(lerp_weight), beta2=float(beta2),
        one_minus_beta2=float(one_minus_beta2), bc2_sqrt=float(bc2_sqrt), eps=float(eps),
        neg_step=float(neg_step),
    )  # fmt: skip
    if versions:
        moved = [param, exp_avg, exp_avg_sq, exp_avg_sq] + ([param] if decay == 1 else [])
        torch.autograd.graph.increment_version(moved)
