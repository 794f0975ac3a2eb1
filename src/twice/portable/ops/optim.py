"""The fused optimizer kernels (`Adam`, `AdamW`, `SGD` and `Adagrad` with `fused=True`) in
portable mode:
torch's single-tensor forms, operation for operation, with portable kernels for each step, so a
fused optimizer gives the bits its unfused form gives under `--portable`; Adam's and AdamW's
plain steps (no amsgrad, maximize or GradScaler) in the one compiled pass the single-tensor
form takes (`single_tensor_adam`). Not yet where the unfused form computes in tensors what the
fused kernel computes on Python floats: a tensor learning rate or betas, float16 or bfloat16
parameters, GradScaler's unscaling (the same bits on every machine, not the unfused form's)."""

from __future__ import annotations

import torch

from twice.portable.dispatch.table import KERNELS, kernel
from twice.portable.native import optim as native_optim
from twice.portable.ops.math import _add, _addcdiv, _addcmul, _lerp, floating

__all__: list[str] = []


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, decoupled, grad_scale=None,
          found_inf=None):  # fmt: skip
    floating(*params, *grads)
    if isinstance(lr, torch.Tensor):
        lr = float(lr)
    if found_inf is not None and float(found_inf) != 0:
        return  # GradScaler found an inf: the step is skipped, as torch's kernel skips it
    sqrt = KERNELS["sqrt.default"]
    one_pass = grad_scale is None and not amsgrad and not maximize
    one_pass = one_pass and _in_range(lr, beta1, beta2, weight_decay, eps)
    for i, param in enumerate(params):
        if one_pass and native_optim.applies(param, grads[i], exp_avgs[i], exp_avg_sqs[i]):
            _one_pass(
                param, grads[i], exp_avgs[i], exp_avg_sqs[i], float(steps[i]), lr, beta1, beta2,
                weight_decay, eps, decoupled, versions=False,
            )  # fmt: skip
            continue  # (the step was counted before the fused kernel was called)
        grad = grads[i] if grad_scale is None else torch.div(grads[i], grad_scale)
        grad = -grad if maximize else grad
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        if weight_decay != 0:
            if decoupled:
                param.mul_(1 - lr * weight_decay)
            else:
                grad = _add(grad, param, alpha=weight_decay)
        exp_avg.copy_(_lerp(exp_avg, grad, 1 - beta1))
        exp_avg_sq.mul_(beta2)
        exp_avg_sq.copy_(_addcmul(exp_avg_sq, grad, grad, value=1 - beta2))
        step = float(steps[i])  # torch's fused kernel is called after the steps were counted
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        second = exp_avg_sq
        if amsgrad:
            torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
            second = max_exp_avg_sqs[i]
        denom = torch.add(torch.div(sqrt(second), bias_correction2_sqrt), eps)
        param.copy_(_addcdiv(param, exp_avg, denom, value=-step_size))


@kernel("_fused_adam_.default", "_fused_adam_.tensor_lr")
def _fused_adam(*args, **kwargs):
    _adam(*args, **kwargs, decoupled=False)


@kernel("_fused_adamw_.default", "_fused_adamw_.tensor_lr")
def _fused_adamw(*args, **kwargs):
    _adam(*args, **kwargs, decoupled=True)


@kernel("_fused_sgd_.default", "_fused_sgd_.tensor_lr")
def _fused_sgd(params, grads, buffers, *, weight_decay, momentum, lr, dampening, nesterov,
               maximize, is_first_step, grad_scale=None, found_inf=None):  # fmt: skip
    floating(*params, *grads)
    if isinstance(lr, torch.Tensor):
        lr = float(lr)
    if found_inf is not None and float(found_inf) != 0:
        return
    for i, param in enumerate(params):
        grad = grads[i] if grad_scale is None else torch.div(grads[i], grad_scale)
        grad = -grad if maximize else grad
        if weight_decay != 0:
            grad = _add(grad, param, alpha=weight_decay)
        if momentum != 0:
            buf = buffers[i]
            if is_first_step:
                buf.copy_(grad)
            else:
                buf.mul_(momentum)
                buf.copy_(_add(buf, grad, alpha=1 - dampening))
            grad = _add(grad, buf, alpha=momentum) if nesterov else buf
        param.copy_(_add(param, grad, alpha=-lr))


@kernel("_fused_adagrad_.default")
def _fused_adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                   maximize, grad_scale=None, found_inf=None):  # fmt: skip
    floating(*params, *grads)
    if found_inf is not None and float(found_inf) != 0:
        return
    sqrt = KERNELS["sqrt.default"]
    for i, param in enumerate(params):
        grad = grads[i] if grad_scale is None else torch.div(grads[i], grad_scale)
        grad = -grad if maximize else grad
        if weight_decay != 0:
            grad = _add(grad, param, alpha=weight_decay)
        step = float(state_steps[i])  # counted before the kernel is called
        clr = lr / (1 + (step - 1) * lr_decay)
        state_sums[i].copy_(_addcmul(state_sums[i], grad, grad, value=1))
        std = torch.add(sqrt(state_sums[i]), eps)
        param.copy_(_addcdiv(param, grad, std, value=-clr))


_ADAM_OPTIONS = {"amsgrad", "has_complex", "beta1", "beta2", "lr", "weight_decay", "eps"}
_ADAM_OPTIONS |= {"maximize", "capturable", "differentiable", "decoupled_weight_decay"}


def single_tensor_adam(original, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                       state_steps, grad_scale=None, found_inf=None, **options):  # fmt: skip
    """torch.optim.adam's `_single_tensor_adam` (Adam, and AdamW through it) under portable
    mode, with no other dispatch mode active (detours.py checks): each parameter's step in one
    compiled pass (native.optim.adam) with the bits the mode gives torch's loop of eight or so
    operations, where the pass applies; torch's loop (each operation through the mode) for a
    parameter where it does not, and for every option it does not cover (amsgrad, maximize,
    tensors as hyperparameters, values outside the constructor's ranges, complex parameters,
    capturable or differentiable steps, GradScaler's arguments)."""
    lr, beta1, beta2 = options.get("lr"), options.get("beta1"), options.get("beta2")
    weight_decay, eps = options.get("weight_decay"), options.get("eps")
    flags = ("amsgrad", "has_complex", "capturable", "differentiable", "maximize")
    if (
        grad_scale is not None
        or found_inf is not None
        or not set(options) <= _ADAM_OPTIONS
        or not _in_range(lr, beta1, beta2, weight_decay, eps)
        or any(options.get(flag) for flag in flags)
        or torch.compiler.is_compiling()
    ):
        return original(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                        grad_scale, found_inf, **options)  # fmt: skip
    decoupled = bool(options.get("decoupled_weight_decay"))
    for i, param in enumerate(params):
        grad, exp_avg, exp_avg_sq, step_t = grads[i], exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        if not native_optim.applies(param, grad, exp_avg, exp_avg_sq):
            one = slice(i, i + 1)
            original(params[one], grads[one], exp_avgs[one], exp_avg_sqs[one],
                     max_exp_avg_sqs[one], state_steps[one], None, None, **options)  # fmt: skip
            continue
        step_t += 1  # torch's operations from here, in its order, on Python floats
        _one_pass(param, grad, exp_avg, exp_avg_sq, step_t.item(), lr, beta1, beta2,
                  weight_decay, eps, decoupled)  # fmt: skip


def _in_range(lr, beta1, beta2, weight_decay, eps) -> bool:
    """Whether the hyperparameters are numbers in the constructor's ranges (the one pass's)."""
    scalars = (lr, beta1, beta2, weight_decay, eps)
    if any(type(x) not in (float, int) for x in scalars):
        return False
    return 0 <= beta1 < 1 and 0 <= beta2 < 1 and lr >= 0 and eps >= 0 and weight_decay >= 0


def _one_pass(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, weight_decay, eps,
              decoupled, versions=True) -> None:  # fmt: skip
    """Step `step` of single-tensor Adam (AdamW where decoupled) for one parameter in one
    compiled pass (native.optim.adam: the bits of torch's loop under the mode), on tensors
    `native_optim.applies` takes, its scalars computed as torch's loop computes them, on Python
    floats. versions: move the tensors' version counters as the single-tensor loop does (the
    fused kernel, as torch's, moves none)."""
    decay, decay_value = 0, 0.0
    if weight_decay != 0:
        decay, decay_value = (1, 1 - lr * weight_decay) if decoupled else (2, weight_decay)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    native_optim.adam(
        param, grad, exp_avg, exp_avg_sq, decay=decay, decay_value=decay_value,
        lerp_weight=1 - beta1, beta2=beta2, one_minus_beta2=1 - beta2,
        bc2_sqrt=bias_correction2**0.5, eps=eps, neg_step=-step_size, versions=versions,
    )  # fmt: skip
