"""arithmetic/elementwise: twice's own functions give the same bits compiled or not, sqrt is
correctly rounded, and each is as accurate as docs/portable.md says (accuracy is a
tolerance; every reproducibility claim here is torch.equal)."""

import numpy as np
import pytest
import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic import philox
from unit.portable.bits import (
    F64,
    both,
    gen,
    needs_native,
    same_bits,
    values,
)


@needs_native
@pytest.mark.parametrize(
    "name", ["sqrt", "exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "silu"]
)
def test_elementwise_native_equals_fallback(name):
    x = values()
    for inp in (x, x.float().double()):
        if name in ("sqrt", "log"):
            inp = inp.abs()
        fast, slow = both(lambda inp=inp: getattr(ew, name)(inp))
        assert same_bits(fast, slow), name


@needs_native
def test_activation_gradients_and_random_native_equal_fallback():
    x = values(1)
    g = torch.randn(x.shape, generator=gen(2), dtype=F64)
    for approximate in ("none", "tanh"):
        assert same_bits(*both(lambda a=approximate: ew.gelu(x, a)))
        assert same_bits(*both(lambda a=approximate: ew.gelu_backward(g, x, a)))
    assert same_bits(*both(lambda: ew.silu_backward(g, x)))
    assert same_bits(*both(lambda: ew.softplus(x, 1.5, 20.0)))
    for count in (0, 1, 7, 1000):
        assert torch.equal(*both(lambda c=count: philox.uniform(c, 99)))
        assert torch.equal(*both(lambda c=count: philox.normal(c, 99)))


def test_sqrt_is_correctly_rounded_on_both_paths():
    g = gen(4)
    x = torch.cat(
        [
            torch.rand(200_000, generator=g, dtype=F64) * 10,
            torch.exp(torch.randn(200_000, generator=g, dtype=F64) * 200),
            torch.tensor([0.0, 5e-324, 1.7e308, 2.0, 4.0, 1e-310], dtype=F64),
        ]
    )
    expected = torch.from_numpy(np.sqrt(x.numpy()))
    fast, slow = both(lambda: ew.sqrt(x))
    assert torch.equal(fast, expected) and torch.equal(slow, expected)
    x32 = torch.rand(200_000, generator=g) * 100
    assert torch.equal(ew.sqrt(x32.double()).float(), torch.from_numpy(np.sqrt(x32.numpy())))
    # torch's own is not, which is why portable mode replaces it
    assert not torch.equal(torch.sqrt(x32), torch.from_numpy(np.sqrt(x32.numpy())))


@pytest.mark.parametrize(
    "name, ulps",
    [("exp", 2), ("log", 3), ("log1p", 3), ("expm1", 3), ("tanh", 3), ("sigmoid", 3), ("erf", 3)],
)
def test_elementwise_functions_are_accurate(name, ulps):
    x = values(5)
    x = x[torch.isfinite(x)]
    if name == "log":
        x = x.abs() + 1e-300
    if name == "log1p":
        x = x.abs() * 0.1 - 0.5
    ours, theirs = getattr(ew, name)(x), getattr(torch, name)(x)
    keep = torch.isfinite(theirs) & (theirs.abs() > 1e-300)
    rel = ((ours - theirs).abs() / theirs.abs())[keep]
    assert float(rel.max()) <= ulps * 2.0**-52
