"""Portable random operations: each call draws one 64-bit key from torch's generator (the one
passed, or the default CPU one) and computes element i from Philox(key, counter i), so the numbers
are the same on every device and thread count (philox.py). Every distribution is made from those
uniforms and normals with twice's own elementwise functions."""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic import philox
from twice.portable.dispatch.table import PortableUnsupported, kernel
from twice.portable.ops.math import floating

_F64 = torch.float64

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


# The *_like forms: the factory with the tensor's shape, dtype and device.


@kernel("rand_like.default", "rand_like.generator")
def _rand_like(x, *, generator=None, dtype=None, device=None, **_):
    return _rand(
        tuple(x.shape), generator=generator, dtype=dtype or x.dtype, device=device or x.device
    )


@kernel("randn_like.default", "randn_like.generator")
def _randn_like(x, *, generator=None, dtype=None, device=None, **_):
    return _randn(
        tuple(x.shape), generator=generator, dtype=dtype or x.dtype, device=device or x.device
    )


@kernel("randint_like.default", "randint_like.Tensor", "randint_like.generator")
@kernel("randint_like.Tensor_generator")
def _randint_like(x, high, *, generator=None, dtype=None, device=None, **_):
    values = _integers(x.numel(), 0, int(high), generator, device or x.device)
    return values.reshape(x.shape).to(dtype=dtype or x.dtype, device=device or x.device)


@kernel("randint_like.low_dtype", "randint_like.low_generator_dtype")
def _randint_like_low(x, low, high, *, generator=None, dtype=None, device=None, **_):
    values = _integers(x.numel(), int(low), int(high), generator, device or x.device)
    return values.reshape(x.shape).to(dtype=dtype or x.dtype, device=device or x.device)


# The other in-place distributions, by inversion of Philox uniforms with twice's functions.


def _uniforms(self, generator):
    floating(self)
    return philox.uniform(self.numel(), philox.draw_key(generator), self.device)


@kernel("exponential_.default")
def _exponential_(self, lambd=1.0, *, generator=None):
    u = _uniforms(self, generator)  # 1 - u in (0, 1]: a finite draw
    return _fill(self, -ew.log1p(-u) / float(lambd))


@kernel("geometric_.default")
def _geometric_(self, p, *, generator=None):
    if not 0 < float(p) <= 1:
        raise PortableUnsupported(f"geometric_ with p = {p}, outside (0, 1]")
    u = _uniforms(self, generator)
    if float(p) == 1:
        return _fill(self, torch.ones_like(u))
    failures = ew.log1p(-u) / ew.log1p(torch.tensor(-float(p), dtype=_F64, device=u.device))
    return _fill(self, torch.floor(failures) + 1.0)


@kernel("cauchy_.default")
def _cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
    u = _uniforms(self, generator)
    sin, cos = ew.sincos_turns((u - 0.5) * 0.5 + torch.where(u < 0.5, 1.0, 0.0))  # pi (u - 1/2)
    return _fill(self, float(median) + float(sigma) * (sin / cos))


@kernel("log_normal_.default")
def _log_normal_(self, mean=1.0, std=2.0, *, generator=None):
    floating(self)
    n = philox.normal(self.numel(), philox.draw_key(generator), self.device)
    return _fill(self, ew.exp(n * float(std) + float(mean)))


@kernel("multinomial.default")
def _multinomial(probs, num_samples, replacement=False, *, generator=None):
    """Draws by the order of exponential keys E/p (without replacement: the smallest keys,
    which is sampling in proportion to p one at a time) or by inverting the exact running sum of
    p (with replacement)."""
    floating(probs)
    rows = probs.reshape(-1, probs.shape[-1]).to(_F64)
    count, n = rows.shape
    key = philox.draw_key(generator)
    if replacement:
        from twice.portable.arithmetic.exact import exact_cumsum

        total = exact_cumsum(rows, -1)
        u = philox.uniform(count * num_samples, key, probs.device).view(count, num_samples)
        picked = torch.searchsorted(total, u * total[:, -1:], right=True)
        picked = torch.clamp(picked, max=n - 1)
    else:
        if num_samples > n:
            raise PortableUnsupported("multinomial without replacement of more than n samples")
        u = philox.uniform(count * n, key, probs.device).view(count, n)
        keys = -ew.log1p(-u) / rows  # a zero probability gives +inf: never drawn before others
        picked = torch.sort(keys, dim=-1, stable=True).indices[:, :num_samples]
    return picked.reshape(*probs.shape[:-1], num_samples)


def _rrelu_slopes(x, lower, upper, training, generator):
    floating(x)
    if not training:
        return None
    u = philox.uniform(x.numel(), philox.draw_key(generator), x.device).reshape(x.shape)
    slopes = (u * (float(upper) - float(lower)) + float(lower)).to(x.dtype)
    return torch.where(x >= 0, torch.ones_like(slopes), slopes)


@kernel("rrelu_with_noise.default")
def _rrelu_with_noise(x, noise, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
    slopes = _rrelu_slopes(x, lower, upper, training, generator)
    if slopes is None:
        return torch.where(x >= 0, x, x * ((float(lower) + float(upper)) / 2.0))
    noise.copy_(slopes)
    return torch.mul(x, slopes)


@kernel("rrelu_with_noise_functional.default")
def _rrelu_functional(x, noise, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
    slopes = _rrelu_slopes(x, lower, upper, training, generator)
    if slopes is None:
        return torch.where(x >= 0, x, x * ((float(lower) + float(upper)) / 2.0)), noise.clone()
    return torch.mul(x, slopes), slopes


def _normals_like(shape, generator, device):
    return philox.normal(math.prod(shape), philox.draw_key(generator), device).reshape(shape)


@kernel("normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor")
def _normal_tensors(mean, std=1.0, *, generator=None):
    floating(mean, std)
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    dtype = tensors[0].dtype
    n = _normals_like(shape, generator, tensors[0].device)
    std64 = std.to(_F64) if isinstance(std, torch.Tensor) else float(std)
    mean64 = mean.to(_F64) if isinstance(mean, torch.Tensor) else float(mean)
    return (n * std64 + mean64).to(dtype)


@kernel("normal.float_float")
def _normal_floats(mean, std, size, *, generator=None, dtype=None, device=None, **_):
    n = _normals_like(tuple(size), generator, device)
    return (n * float(std) + float(mean)).to(
        dtype=dtype or torch.get_default_dtype(), device=device
    )
