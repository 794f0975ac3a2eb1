"""Portable kernels for the losses PyTorch does not decompose: the margin losses' gradients, the
trilinear product behind nn.functional.bilinear, the connectionist temporal classification
loss (CTC) with its gradient, and torch 2.13's chunked linear cross-entropy (its two `torch_nn`
custom ops), computed whole: exact sums make the batch's chunks, their size and the
accumulator's dtype change no bit.

Each follows torch's own formula, computed in float64 with exact sums (exact.py) and twice's
elementwise functions, and rounded once to the input's dtype. CTC's recursions over time run
one fixed step per time index (a log-sum-exp of two or three terms in a fixed order), each
element frozen once past its own input length, so a sample's loss depends on its inputs alone.
"""

from __future__ import annotations

import contextlib
import math

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import exact_bilinear, exact_sum
from twice.portable.dispatch.table import KERNELS, PortableUnsupported, kernel
from twice.portable.ops.math import floating

__all__ = ["trilinear", "logaddexp"]

_F64 = torch.float64
_NEG_INF = -math.inf


def _frames(x: torch.Tensor) -> tuple[int, int]:
    """(rows, classes) of a margin loss's input: (C,) and () are one row."""
    if x.dim() <= 1:
        return 1, max(1, x.numel())
    return x.shape[0], x.shape[1]


def _scaled(grad_output, reduction, rows, values):
    """The per-element gradient times the incoming gradient (a scalar, or one per row)."""
    go = grad_output.to(_F64)
    if reduction == 0 and go.dim() > 0:
        go = go.reshape(rows, 1)
    return values * go


@kernel("multi_margin_loss_backward.default")
def _multi_margin_backward(grad_output, x, target, p, margin, weight=None, reduction=1):
    """d/dx of sum_{d != t} max(0, margin - x_t + x_d)^p / C (weighted by w_t): h = g (p = 1)
    or 2 g z at each d where z > 0, and minus their exact sum at the target."""
    floating(x, grad_output)
    rows, classes = _frames(x)
    x64 = x.to(_F64).reshape(rows, classes)
    t = target.reshape(rows, 1).to(torch.int64)
    g = 1.0 / (rows * classes) if reduction == 1 else 1.0 / classes
    z = (float(margin) - x64.gather(1, t)) + x64
    h = torch.full_like(z, g) if int(p) == 1 else (2.0 * g) * z
    if weight is not None:
        h = h * weight.to(_F64)[t.reshape(rows)].reshape(rows, 1)
    others = torch.arange(classes, device=x.device).reshape(1, classes) != t
    h = torch.where(others & (z > 0), h, 0.0)
    at_target = -exact_sum(h, (1,), True, _F64, x.dtype)
    h = h.scatter(1, t, at_target)
    return _scaled(grad_output, reduction, rows, h).reshape(x.shape).to(x.dtype)


def _multilabel_pairs(x, target):
    """(rows, classes, x in float64, the listed targets' indices, z = 1 - x_j + x_d for each
    listed target j and class d, where it counts: z > 0 and d not a target, and is_target)."""
    rows, classes = _frames(x)
    x64 = x.to(_F64).reshape(rows, classes)
    tgt = target.reshape(rows, classes).to(torch.int64)
    listed = (tgt < 0).to(torch.int64).cumsum(1) == 0  # the targets before the first -1
    index = tgt.clamp(min=0)
    is_target = torch.zeros(rows, classes + 1, dtype=torch.bool, device=x.device)
    is_target = is_target.scatter(1, torch.where(listed, index, classes), True)[:, :classes]
    z = (1.0 - x64.gather(1, index)).unsqueeze(2) + x64.unsqueeze(1)
    active = (z > 0) & listed.unsqueeze(2) & ~is_target.unsqueeze(1)
    return rows, classes, index, listed, z, active, is_target


@kernel("multilabel_margin_loss_forward.default")
def _multilabel_margin(x, target, reduction):
    """sum over listed targets j (those before the first -1) and non-targets d of
    max(0, 1 - x_j + x_d) / C, summed exactly (torch's decomposition also counts the pairs
    after a -1, which its own kernel does not)."""
    floating(x)
    rows, classes, _, _, z, active, is_target = _multilabel_pairs(x, target)
    z = torch.where(active, z, 0.0)
    if reduction == 0 and x.dim() == 2:
        loss = exact_sum(z, (1, 2), False, _F64, x.dtype) / classes
    else:
        loss = exact_sum(z, None, False, _F64, x.dtype) / (
            classes * rows if reduction == 1 else classes
        )
    return loss.to(x.dtype), is_target.to(x.dtype).reshape(x.shape)


@kernel("multilabel_margin_loss_backward.default")
def _multilabel_margin_backward(grad_output, x, target, reduction, is_target):
    """Each pair (listed target j, non-target d) with 1 - x_j + x_d > 0 adds g at d and takes
    g from j: the pairs are counted in integers, then scaled once."""
    floating(x, grad_output)
    rows, classes, index, listed, _, active, _ = _multilabel_pairs(x, target)
    counts = active.sum(1)
    counts = counts.scatter_add(1, index, -(active.sum(2) * listed))
    g = 1.0 / (rows * classes) if reduction == 1 else 1.0 / classes
    out = _scaled(grad_output, reduction, rows, counts.to(_F64) * g)
    return out.reshape(x.shape).to(x.dtype)


def _expanded(t: torch.Tensor, dims, total: int) -> torch.Tensor:
    for d in range(total):
        if d in dims:
            t = t.unsqueeze(d)
    return t


@kernel("_trilinear.default")
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """sum over `sumdim` of i1 * i2 * i3 (each unsqueezed at its `expand` dims): i1 * i3 in
    float64 (exact for float32 and narrower; a float64 product rounded once, so a float64
    result carries two roundings, and a product beyond the double range overflows), then its
    products with i2 summed exactly, rounded once."""
    floating(i1, i2, i3)
    total = i1.dim() + len(expand1)
    sumdim = tuple(sorted(int(d) % total for d in sumdim))
    a = _expanded(i1.to(_F64), set(expand1), total) * _expanded(i3.to(_F64), set(expand3), total)
    b = _expanded(i2, set(expand2), total)
    dtype = torch.result_type(i1, i2)
    if not sumdim:
        return (a * b.to(_F64)).to(dtype)
    shape = torch.broadcast_shapes(a.shape, b.shape)
    terms = max(1, math.prod(shape[d] for d in sumdim))

    def form(u, v):
        return (u * v).sum(dim=sumdim)

    return exact_bilinear(a, b, form, sumdim, sumdim, terms, dtype, precision=dtype)


def logaddexp(*terms: torch.Tensor) -> torch.Tensor:
    """ln sum exp(t_i) for two or three terms, in this order: the largest m taken out, then
    m + ln(sum of exp(t_i - m)), a sum in [1, 3] (-inf where all are -inf)."""
    top = terms[0]
    for t in terms[1:]:
        top = torch.maximum(top, t)
    safe = torch.where(torch.isfinite(top), top, 0.0)
    total = None
    for t in terms:
        e = ew.exp(t - safe)
        total = e if total is None else total + e
    out = safe + ew.log(total)
    return torch.where(top == _NEG_INF, _NEG_INF, out)


def _ctc_layout(log_probs, targets, input_lengths, target_lengths, blank):
    """(lengths of inputs, of targets, the extended target l' per sample: blank, l_1, blank, ...,
    and where each s of l' is within its sample's 2 |l| + 1)."""
    device = log_probs.device
    il = torch.as_tensor(input_lengths, dtype=torch.int64, device=device).reshape(-1)
    tl = torch.as_tensor(target_lengths, dtype=torch.int64, device=device).reshape(-1)
    width = int(tl.max()) if tl.numel() else 0
    k = torch.arange(max(width, 1), device=device)
    if targets.dim() == 1:  # concatenated: each sample's targets start after the previous ones
        start = tl.cumsum(0) - tl
        flat = targets.to(torch.int64)
        at = (start.unsqueeze(1) + k).clamp(max=max(flat.numel() - 1, 0))
        tg = flat[at] if flat.numel() else torch.zeros_like(at)
    else:
        tg = targets.to(torch.int64)[:, : max(width, 1)]
        tg = torch.nn.functional.pad(tg, (0, max(width, 1) - tg.shape[1]))
    s = torch.arange(2 * width + 1, device=device)
    prime = torch.where(s % 2 == 0, blank, tg[:, (s // 2).clamp(max=max(width, 1) - 1)])
    prime = torch.where(s % 2 == 0, torch.full_like(prime, blank), prime)
    inside = s.unsqueeze(0) <= 2 * tl.unsqueeze(1)
    # s - 2 may be skipped to where l'_s differs from l'_{s-2} (never onto or from a blank)
    skip = torch.zeros_like(inside)
    if s.numel() > 2:
        skip[:, 2:] = prime[:, 2:] != prime[:, :-2]
    return il, tl, prime, inside, skip


def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """x moved `by` places along its last dim (right for by > 0), -inf filling the gap."""
    out = torch.full_like(x, _NEG_INF)
    if by > 0:
        out[..., by:] = x[..., :-by]
    else:
        out[..., :by] = x[..., -by:]
    return out


@kernel("_ctc_loss.default", "_ctc_loss.Tensor")
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """-ln p(l | x) by the forward recursion alpha_t(s) = ln(alpha_{t-1}(s) + alpha_{t-1}(s-1)
    [+ alpha_{t-1}(s-2)]) + y_t(l'_s), returned with alpha (torch's layout: N, T, 2 S + 1)."""
    floating(log_probs)
    lp = log_probs.to(_F64)
    il, tl, prime, inside, skip = _ctc_layout(
        log_probs, targets, input_lengths, target_lengths, blank
    )
    steps = lp.shape[0]
    emit = lp.permute(1, 0, 2).gather(2, prime.unsqueeze(1).expand(-1, steps, -1))  # N, T, L
    s = torch.arange(prime.shape[1], device=lp.device)
    first = inside & (s <= 1) & (il > 0).unsqueeze(1)
    alpha = torch.where(first, emit[:, 0], _NEG_INF)
    alphas = [alpha]
    for t in range(1, steps):
        three = logaddexp(alpha, _shift(alpha, 1), torch.where(skip, _shift(alpha, 2), _NEG_INF))
        going = inside & (t < il).unsqueeze(1)
        alpha = torch.where(going, three + emit[:, t], _NEG_INF)
        alphas.append(alpha)
    log_alpha = torch.stack(alphas, 1)  # N, T, L
    last = (il - 1).clamp(min=0).reshape(-1, 1, 1).expand(-1, 1, log_alpha.shape[2])
    end = log_alpha.gather(1, last).squeeze(1)
    l1 = end.gather(1, (2 * tl).unsqueeze(1)).squeeze(1)
    l2 = end.gather(1, (2 * tl - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    l2 = torch.where(tl > 0, l2, _NEG_INF)
    nll = -logaddexp(l1, l2)
    return nll.to(log_probs.dtype), log_alpha.to(log_probs.dtype)


def _ctc_beta(emit, il, tl, inside, skip):
    """The backward recursion, t from the end: beta_t(s) = ln(beta_{t+1}(s) + beta_{t+1}(s+1)
    [+ beta_{t+1}(s+2)]) + y_t(l'_s), started at each sample's own last step."""
    steps = emit.shape[1]
    s = torch.arange(emit.shape[2], device=emit.device)
    start = inside & (s >= 2 * tl.unsqueeze(1) - 1)
    beta = torch.full_like(emit[:, 0], _NEG_INF)
    betas = [beta] * steps
    for t in range(steps - 1, -1, -1):
        ahead = torch.where(_shift(skip, -2), _shift(beta, -2), _NEG_INF)
        three = logaddexp(beta, _shift(beta, -1), ahead) + emit[:, t]
        init = (t == il - 1).unsqueeze(1) & start
        going = (t < il - 1).unsqueeze(1) & inside
        beta = torch.where(init, emit[:, t], torch.where(going, three, _NEG_INF))
        betas[t] = beta
    return torch.stack(betas, 1)  # N, T, L


@kernel("_ctc_loss_backward.default", "_ctc_loss_backward.Tensor")
def _ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_inf=False
):
    """torch's gradient with respect to the log-probabilities: exp(y_t(c)) - exp(ln sum over
    s with l'_s = c of alpha_t(s) beta_t(s) + nll - y_t(c)), times the incoming gradient; each
    class's sum taken exactly around its largest term. 0 past each input's length."""
    floating(log_probs, grad)
    lp = log_probs.to(_F64)
    il, tl, prime, inside, skip = _ctc_layout(
        log_probs, targets, input_lengths, target_lengths, blank
    )
    steps, classes = lp.shape[0], lp.shape[2]
    emit = lp.permute(1, 0, 2).gather(2, prime.unsqueeze(1).expand(-1, steps, -1))
    beta = _ctc_beta(emit, il, tl, inside, skip)
    ab = log_alpha.to(_F64) + beta  # N, T, L
    ab = torch.where(inside.unsqueeze(1) & (beta > _NEG_INF), ab, _NEG_INF)
    group = prime.unsqueeze(2) == torch.arange(classes, device=lp.device)  # N, L, C
    terms = torch.where(group.unsqueeze(1), ab.unsqueeze(3), _NEG_INF)  # N, T, L, C
    top = terms.amax(2, keepdim=True)
    safe = torch.where(torch.isfinite(top), top, 0.0)
    e = torch.where(terms > _NEG_INF, ew.exp(terms - safe), 0.0)
    lcab = (safe + ew.log(exact_sum(e, (2,), True, _F64, log_probs.dtype))).squeeze(2)
    lcab = torch.where(top.squeeze(2) > _NEG_INF, lcab, _NEG_INF).permute(1, 0, 2)  # T, N, C
    nll64 = nll.to(_F64).reshape(1, -1, 1)
    out = (ew.exp(lp) - ew.exp((lcab + nll64) - lp)) * grad.to(_F64).reshape(1, -1, 1)
    live = (torch.arange(steps, device=lp.device).unsqueeze(1) < il).unsqueeze(2)
    if zero_inf:
        live = live & (nll64 != math.inf)
    return torch.where(live, out, 0.0).to(log_probs.dtype)


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}

with contextlib.suppress(ImportError):  # torch 2.13: registers the torch_nn ops taken below
    import torch.nn.modules.linear_cross_entropy  # noqa: F401


def _linear_log_softmax(x, w, bias):
    """log_softmax(x @ w.T + bias) over the classes, as F.linear and F.log_softmax give it under
    portable mode (the product rounded once, then the bias added)."""
    logits = KERNELS["mm.default"](x, w.t())
    if bias is not None:
        logits = torch.add(logits, bias)
    return KERNELS["_log_softmax.default"](logits, 1, False)


@kernel("torch_nn::_linear_cross_entropy_batch_chunked.default")
def _linear_cross_entropy_chunked(x, w, target, bias, weight, reduction, ignore_index,
                                  label_smoothing, batch_chunk_size, acc_policy, acc_dtype,
                                  allow_retain_graph, compute_input_grad, compute_weight_grad,
                                  compute_bias_grad):  # fmt: skip
    """The mean or sum loss and its gradients at an incoming gradient of 1 (the op's backward
    multiplies them by the real one), from the whole batch: the logits' rows, the reference
    path's nll_loss and log_softmax backward, and the gradients' exact products and sums, so
    `batch_chunk_size`, `acc_policy` and `acc_dtype` (torch's accumulation, which the chunks
    would decide) change no bit. label_smoothing is 0 on this path (torch's gate)."""
    if label_smoothing != 0.0 or reduction not in ("mean", "sum"):
        raise PortableUnsupported(f"chunked linear_cross_entropy with {reduction=}")
    floating(x, w)
    lsm = _linear_log_softmax(x, w, bias)
    code = _REDUCTIONS[reduction]
    loss, total = KERNELS["nll_loss_forward.default"](lsm, target, weight, code, ignore_index)
    one = torch.ones((), dtype=lsm.dtype)
    grad_lsm = KERNELS["nll_loss_backward.default"](
        one, lsm, target, weight, code, ignore_index, total
    )
    grad = KERNELS["_log_softmax_backward_data.default"](grad_lsm, lsm, 1, lsm.dtype)
    mm = KERNELS["mm.default"]
    empty = x.new_empty
    grad_x = mm(grad, w).to(x.dtype) if compute_input_grad else empty((0, 0))
    grad_w = mm(grad.t(), x).to(x.dtype) if compute_weight_grad else empty((0, 0))
    if compute_bias_grad:
        grad_b = KERNELS["sum.dim_IntList"](grad, [0]).to(x.dtype)
    else:
        grad_b = empty((0,))
    return loss.to(x.dtype), grad_x, grad_w, grad_b


@kernel("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction.default")
def _linear_cross_entropy_chunked_none(x, w, target, bias, weight, ignore_index,
                                       batch_chunk_size, acc_policy, acc_dtype):  # fmt: skip
    """Each sample's loss from its own logits row (the chunk it falls in changes no bit). Its
    gradients come from torch's own chunked Python code, each operation portable: in float32 and
    float64 torch picks the same chunks on every device, in half precision not (its automatic
    chunk size and accumulator differ between CPU and GPU), so there a gradient is refused."""
    floating(x, w)
    lsm = _linear_log_softmax(x, w, bias)
    loss, _ = KERNELS["nll_loss_forward.default"](lsm, target, weight, 0, ignore_index)
    return loss.to(x.dtype)


def _half_gradient(x, w, target, bias, *rest):
    """The no-reduction op's check on its own arguments (before half precision is widened)."""
    wanted = any(t is not None and t.requires_grad for t in (x, w, bias))
    if wanted and {x.dtype, w.dtype} & {torch.float16, torch.bfloat16}:
        raise PortableUnsupported(
            "chunked linear_cross_entropy with reduction='none' and a gradient in half "
            "precision: torch's chunks for it depend on the device"
        )


_linear_cross_entropy_chunked_none.precheck = _half_gradient
