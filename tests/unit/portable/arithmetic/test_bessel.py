"""The Bessel, Airy and incomplete gamma algorithms: accurate to the figures docs/portable.md
gives (against SciPy in float64), torch's special cases, and each element's result its own."""

import math

import numpy as np
import pytest
import torch
from scipy import special as scipy_special

from twice.portable.arithmetic import bessel

RNG = np.random.default_rng(53)
SIGNED = np.concatenate([RNG.uniform(-60, 60, 6000), 10 ** RNG.uniform(-300, 3, 500)])
POSITIVE = np.concatenate([RNG.uniform(0, 60, 6000), 10 ** RNG.uniform(-300, 3, 500)])
AIRY = np.concatenate([RNG.uniform(-60, 30, 6000), -(10 ** RNG.uniform(-3, 4, 500))])

# (function, reference, inputs, the largest error relative to |reference|, plus an absolute
# allowance where the function oscillates through zero)
CASES = {
    "bessel_j0": (bessel.bessel_j0, scipy_special.j0, SIGNED, 1e-13, 1e-11),
    "bessel_j1": (bessel.bessel_j1, scipy_special.j1, SIGNED, 1e-13, 1e-11),
    "bessel_y0": (bessel.bessel_y0, scipy_special.y0, POSITIVE, 1e-13, 2e-11),
    "bessel_y1": (bessel.bessel_y1, scipy_special.y1, POSITIVE, 1e-13, 2e-11),
    "k0": (bessel.modified_bessel_k0, scipy_special.k0, POSITIVE, 1e-13, 0),
    "k1": (bessel.modified_bessel_k1, scipy_special.k1, POSITIVE, 1e-13, 0),
    "k0e": (bessel.scaled_modified_bessel_k0, scipy_special.k0e, POSITIVE, 1e-13, 0),
    "k1e": (bessel.scaled_modified_bessel_k1, scipy_special.k1e, POSITIVE, 1e-13, 0),
    "airy_ai": (bessel.airy_ai, lambda x: scipy_special.airy(x)[0], AIRY, 1e-12, 5e-11),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_accuracy_against_scipy(name):
    function, reference, x, relative, absolute = CASES[name]
    got = function(torch.tensor(x, dtype=torch.float64)).numpy()
    want = reference(x)
    assert np.all(np.abs(got - want) <= relative * np.abs(want) + absolute + 1e-300)


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values_match_torch(name):
    function = CASES[name][0]
    torch_name = {"k0": "modified_bessel_k0", "k1": "modified_bessel_k1"}.get(name, name)
    torch_name = {
        "k0e": "scaled_modified_bessel_k0",
        "k1e": "scaled_modified_bessel_k1",
    }.get(torch_name, torch_name)
    x = torch.tensor([-math.inf, -1.0, -0.0, 0.0, math.inf, math.nan], dtype=torch.float64)
    got, want = function(x), getattr(torch.special, torch_name)(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.allclose(got[finite], want[finite], rtol=1e-13, atol=0)
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(want[finite]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_element_is_its_own(name):
    """An element's bits do not depend on the tensor around it (the other regions' values,
    the batch's size)."""
    function, _, x, _, _ = CASES[name]
    batch = torch.tensor(x[:300], dtype=torch.float64)
    whole = function(batch)
    for i in range(0, 300, 37):
        assert torch.equal(function(batch[i : i + 1]), whole[i : i + 1])


SHAPES = np.concatenate([RNG.uniform(0, 30, 4000), 10 ** RNG.uniform(-3, 2, 2000)])
POINTS = np.concatenate([RNG.uniform(0, 40, 4000), SHAPES[4000:] * 10 ** RNG.uniform(-1, 1, 2000)])


@pytest.mark.parametrize(
    "function, reference",
    [(bessel.igamma, scipy_special.gammainc), (bessel.igammac, scipy_special.gammaincc)],
)
def test_incomplete_gamma_against_scipy(function, reference):
    got = function(torch.tensor(SHAPES), torch.tensor(POINTS)).numpy()
    want = reference(SHAPES, POINTS)
    assert np.all(np.abs(got - want) <= 1e-12 * np.abs(want) + 1e-15)


def test_incomplete_gamma_special_values_match_torch():
    a = torch.tensor([-1.0, 0, 0, 0, 1, math.inf, math.inf, 1, math.nan, 1, 2, 3])
    x = torch.tensor([1.0, 1, 0, -1, 0, 1, math.inf, math.inf, 1, math.nan, -1, 2.5])
    a, x = a.double(), x.double()
    for ours, theirs in [(bessel.igamma, torch.igamma), (bessel.igammac, torch.igammac)]:
        got, want = ours(a, x), theirs(a, x)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        finite = ~torch.isnan(want)
        assert torch.allclose(got[finite], want[finite], rtol=1e-14, atol=0)


def test_incomplete_gamma_element_is_its_own():
    """A slowly converging element (a = x = 900) beside quick ones changes none of their bits,
    nor do the quick ones change its."""
    a = torch.tensor([0.5, 900.0, 3.0, 2.0], dtype=torch.float64)
    x = torch.tensor([0.1, 900.0, 40.0, 2.5], dtype=torch.float64)
    for function in (bessel.igamma, bessel.igammac):
        whole = function(a, x)
        for i in range(4):
            assert torch.equal(function(a[i : i + 1], x[i : i + 1]), whole[i : i + 1])
