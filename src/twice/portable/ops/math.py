"""Portable kernels for reductions, elementwise functions and the compound arithmetic optimizers
use (registered in table.KERNELS by aten overload name); the products are in products.py.

Compound operations (_add with `alpha`, _addcmul, _addcdiv, _lerp) are spelled out as one IEEE
operation per kernel call, because torch's vectorised kernels may fuse a multiply and an _add into
one rounding on one instruction set and not on another. Products and reductions are exact
(exact.py); the elementwise functions are twice's own (elementwise.py).
"""

from __future__ import annotations

import math

import torch

from twice.portable import native
from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import exact_sum
from twice.portable.dispatch.table import PortableUnsupported, kernel

__all__ = ["floating", "unary", "inplace"]

_F64 = torch.float64
_PORTABLE_DTYPES = (torch.float32, torch.float64)


def floating(*tensors) -> None:
    """Refuse floating-point dtypes other than float32 and float64 (half precision: not covered)."""
    for t in tensors:
        if (
            isinstance(t, torch.Tensor)
            and t.is_floating_point()
            and t.dtype not in _PORTABLE_DTYPES
        ):
            raise PortableUnsupported(f"dtype {t.dtype} (portable mode covers float32 and float64)")


def unary(function, name=None):
    """A float64 function of one tensor as a kernel: evaluate in float64, round once (in one
    pass through the compiled kernel `name` where it applies)."""

    def run(x, *args):
        floating(x)
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())
        if name is not None and (out := native.unary(name, x)) is not None:
            return out
        return function(x.to(_F64), *args).to(x.dtype)

    return run


def inplace(function):
    """The in-place form of a kernel: compute, then copy into the first argument."""

    def run(self, *args, **kwargs):
        self.copy_(function(self, *args, **kwargs))
        return self

    return run


for _name, _fn in {
    "exp": ew.exp,
    "log": ew.log,
    "log1p": ew.log1p,
    "expm1": ew.expm1,
    "tanh": ew.tanh,
    "sigmoid": ew.sigmoid,
    "erf": ew.erf,
    "silu": ew.silu,
    "sqrt": ew.sqrt,
}.items():
    kernel(f"{_name}.default")(unary(_fn, _name))
    kernel(f"{_name}_.default")(inplace(unary(_fn, _name)))
kernel("log2.default")(unary(lambda x: ew.log(x) * (1.0 / math.log(2.0))))
kernel("log10.default")(unary(lambda x: ew.log(x) * (1.0 / math.log(10.0))))
kernel("rsqrt.default")(unary(lambda x: 1.0 / ew.sqrt(x)))
kernel("rsqrt_.default")(inplace(unary(lambda x: 1.0 / ew.sqrt(x))))
kernel("erfc.default")(unary(lambda x: 1.0 - ew.erf(x)))


@kernel("gelu.default")
def _gelu(x, approximate="none"):
    floating(x)
    if (out := native.unary("gelu_tanh" if approximate == "tanh" else "gelu", x)) is not None:
        return out
    return ew.gelu(x.to(_F64), approximate).to(x.dtype)


@kernel("gelu_backward.default")
def _gelu_backward(grad, x, approximate="none"):
    floating(grad, x)
    return ew.gelu_backward(grad.to(_F64), x.to(_F64), approximate).to(grad.dtype)


@kernel("silu_backward.default")
def _silu_backward(grad, x):
    return ew.silu_backward(grad.to(_F64), x.to(_F64)).to(grad.dtype)


@kernel("tanh_backward.default")
def _tanh_backward(grad, y):
    y64 = y.to(_F64)
    return (grad.to(_F64) * (1.0 - y64 * y64)).to(grad.dtype)


@kernel("sigmoid_backward.default")
def _sigmoid_backward(grad, y):
    y64 = y.to(_F64)
    return (grad.to(_F64) * ((1.0 - y64) * y64)).to(grad.dtype)


@kernel("softplus.default")
def _softplus(x, beta=1, threshold=20):
    return ew.softplus(x.to(_F64), float(beta), float(threshold)).to(x.dtype)


@kernel("softplus_backward.default")
def _softplus_backward(grad, x, beta, threshold):
    bx = x.to(_F64) * float(beta)
    d = torch.where(bx > float(threshold), 1.0, ew.sigmoid(bx))
    return (grad.to(_F64) * d).to(grad.dtype)


@kernel("pow.Tensor_Scalar")
def _pow_tensor_scalar(x, exponent):
    floating(x)
    if not x.is_floating_point() and not isinstance(exponent, float):
        return torch.pow(x, exponent)  # integers: exact
    out_dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    return ew.pow_scalar(x.to(_F64), float(exponent)).to(out_dtype)


kernel("pow_.Scalar")(inplace(_pow_tensor_scalar))


@kernel("pow.Tensor_Tensor")
def _pow_tensor_tensor(x, exponent):
    floating(x, exponent)
    dtype = torch.result_type(x, exponent)
    if not dtype.is_floating_point:
        return torch.pow(x, exponent)
    return ew.pow_tensor(x.to(_F64), exponent.to(_F64)).to(dtype)


@kernel("pow.Scalar")
def _pow_scalar_tensor(base, exponent):
    dtype = exponent.dtype if exponent.is_floating_point() else torch.get_default_dtype()
    return ew.pow_tensor(torch.full_like(exponent, float(base), dtype=_F64), exponent.to(_F64)).to(
        dtype
    )


# Compound arithmetic, one rounding per kernel call.


# add and sub take sparse operands (sparse=True): with every sparse operand coalesced (the mode
# refuses others), each position meets at most one addition, exact in any order. A sparse sum is
# coalesced here (its two values a position added once, in either order the same), as torch's
# CPU kernel leaves it but its GPU kernel does not; a sparse tensor is not written in place.


def _canonical(t):
    return t.coalesce() if isinstance(t, torch.Tensor) and t.layout is torch.sparse_coo else t


def _dense_self(t):
    if isinstance(t, torch.Tensor) and t.layout is not torch.strided:
        raise PortableUnsupported("an in-place sum into a sparse tensor")


def _scaled(other, alpha):
    if alpha == 1:
        return other
    if not isinstance(other, torch.Tensor):
        return other * alpha
    return torch.mul(other, alpha)


@kernel("add.Tensor", "add.Scalar", sparse=True)
def _add(self, other, alpha=1):
    if alpha != 1 and isinstance(other, torch.Tensor) and isinstance(self, torch.Tensor):
        if (out := native.compound("add", self, other, None, alpha)) is not None:
            return out
    return _canonical(torch.add(self, _scaled(other, alpha)))


@kernel("add_.Tensor", "add_.Scalar", sparse=True)
def _add_(self, other, alpha=1):
    _dense_self(self)
    if alpha == 1:
        return self.add_(other)
    if isinstance(other, torch.Tensor):
        if native.compound("add", self, other, None, alpha, inplace=True) is not None:
            return self
    return self.add_(_scaled(other, alpha))


@kernel("sub.Tensor", "sub.Scalar", sparse=True)
def _sub(self, other, alpha=1):
    return _canonical(torch.sub(self, _scaled(other, alpha)))


@kernel("sub_.Tensor", "sub_.Scalar", sparse=True)
def _sub_(self, other, alpha=1):
    _dense_self(self)
    return self.sub_(_scaled(other, alpha))


@kernel("rsub.Tensor", "rsub.Scalar")
def _rsub(self, other, alpha=1):
    return torch.sub(other, _scaled(self, alpha))


def _compound(name: str, fallback):
    """The out-of-place and in-place kernels of a compound operation: the compiled kernel where
    it applies (in place into the first argument), otherwise `fallback`'s torch operations."""

    def out_of_place(self, a, b, value=1):
        if (out := native.compound(name, self, a, b, value)) is not None:
            return out
        return fallback(self, a, b, value)

    def in_place(self, a, b, value=1):
        if native.compound(name, self, a, b, value, inplace=True) is not None:
            return self
        return self.copy_(fallback(self, a, b, value))

    return out_of_place, in_place


def _addcmul_ops(self, t1, t2, value):
    return torch.add(self, torch.mul(_scaled(t1, value), t2))


def _addcdiv_ops(self, t1, t2, value):
    return torch.add(self, torch.div(_scaled(t1, value), t2))


_addcmul, _addcmul_ = _compound("addcmul", _addcmul_ops)
_addcdiv, _addcdiv_ = _compound("addcdiv", _addcdiv_ops)
kernel("addcmul.default")(_addcmul)
kernel("addcmul_.default")(_addcmul_)
kernel("addcdiv.default")(_addcdiv)
kernel("addcdiv_.default")(_addcdiv_)


def _lerp_formula(self, end, weight):
    """torch's formula: self + w (end - self) below w = 1/2, end - (end - self)(1 - w) above."""
    diff = torch.sub(end, self)
    if not isinstance(weight, torch.Tensor):
        if abs(weight) < 0.5:
            return torch.add(self, torch.mul(diff, weight))
        return torch.sub(end, torch.mul(diff, 1 - weight))
    low = torch.add(self, torch.mul(diff, weight))
    high = torch.sub(end, torch.mul(diff, torch.sub(1, weight)))
    return torch.where(weight.abs() < 0.5, low, high)


@kernel("lerp.Scalar", "lerp.Tensor")
def _lerp(self, end, weight):
    if not isinstance(weight, torch.Tensor):
        if (out := native.compound("lerp", self, end, None, weight)) is not None:
            return out
    return _lerp_formula(self, end, weight)


@kernel("lerp_.Scalar", "lerp_.Tensor")
def _lerp_(self, end, weight):
    if not isinstance(weight, torch.Tensor):
        if native.compound("lerp", self, end, None, weight, inplace=True) is not None:
            return self
    return self.copy_(_lerp_formula(self, end, weight))


# Reductions.


def _dims(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.dim()))
    return tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)


def _reduced_dtype(x, dtype):
    if dtype is not None:
        return dtype
    return x.dtype if x.is_floating_point() else torch.int64


@kernel("sum.dim_IntList", "sum.default", sparse=True)
def _sum_(x, dim=None, keepdim=False, *, dtype=None):
    if x.layout is not torch.strided:  # a sparse tensor's total: each stored value once
        if dim is not None:
            raise PortableUnsupported(f"a sum of a {x.layout} tensor over some dimensions")
        rank = x.dim()
        values = x._values() if x.layout is torch.sparse_coo else x.values()
        total = _sum_(values, None, False, dtype=dtype)
        return total.reshape([1] * rank) if keepdim else total
    floating(x)
    out = _reduced_dtype(x, dtype)
    if not out.is_floating_point and not x.is_floating_point():
        return torch.sum(x, _dims(x, dim), keepdim, dtype=dtype)
    return exact_sum(x, _dims(x, dim), keepdim, out)


def _count(x, dims) -> int:
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


@kernel("mean.dim", "mean.default")
def _mean(x, dim=None, keepdim=False, *, dtype=None):
    floating(x)
    dims = _dims(x, dim)
    total = exact_sum(x, dims, keepdim, _F64, x.dtype)
    return (total / _count(x, dims)).to(dtype or x.dtype)


def _variance(x, dim, correction, keepdim):
    dims = _dims(x, dim)
    n = _count(x, dims)
    x64 = x.to(_F64)
    mu = exact_sum(x64, dims, True, _F64, x.dtype) / n
    d = x64 - mu
    c = 1 if correction is None else float(correction)
    _var = exact_sum(d * d, dims, keepdim, _F64, x.dtype) / max(n - c, 0)
    return _var, (mu if keepdim else mu.squeeze(dims) if dims else mu)


@kernel("var.correction")
def _var(x, dim=None, *, correction=None, keepdim=False):
    floating(x)
    return _variance(x, dim, correction, keepdim)[0].to(x.dtype)


@kernel("std.correction")
def _std(x, dim=None, *, correction=None, keepdim=False):
    floating(x)
    return ew.sqrt(_variance(x, dim, correction, keepdim)[0]).to(x.dtype)


@kernel("var_mean.correction")
def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    v, mu = _variance(x, dim, correction, keepdim)
    return v.to(x.dtype), mu.to(x.dtype)


@kernel("std_mean.correction")
def _std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, mu = _variance(x, dim, correction, keepdim)
    return ew.sqrt(v).to(x.dtype), mu.to(x.dtype)


@kernel("linalg_vector_norm.default")
def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    floating(x)
    dims, out = _dims(x, dim), dtype or x.dtype
    a = x.to(_F64).abs()
    if ord == math.inf:
        return a.amax(dim=dims, keepdim=keepdim).to(out)
    if ord == -math.inf:
        return a.amin(dim=dims, keepdim=keepdim).to(out)
    if ord == 0:
        return (a != 0).to(_F64).sum(dim=dims, keepdim=keepdim).to(out)
    if ord == 1:
        return exact_sum(a, dims, keepdim, out)
    if ord == 2:
        return ew.sqrt(exact_sum(a * a, dims, keepdim, _F64, out)).to(out)
    p = float(ord)
    total = exact_sum(ew.pow_scalar(a, p), dims, keepdim, _F64, out)
    return ew.pow_scalar(total, 1.0 / p).to(out)


@kernel("_foreach_norm.Scalar")
def _foreach_norm(tensors, ord=2, dtype=None):
    return [_vector_norm(t, ord, None, False, dtype=dtype) for t in tensors]


@kernel("norm.Scalar", "norm.ScalarOpt_dim", "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim_dtype")
def _norm(x, p=2, dim=None, keepdim=False, *, dtype=None):
    """torch.norm as the vector norm (linalg_vector_norm's kernel)."""
    order = 2.0 if p is None else float(p)
    return _vector_norm(x, order, dim, keepdim, dtype=dtype)
