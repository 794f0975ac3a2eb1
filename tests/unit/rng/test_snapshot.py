"""Snapshots of the global Python, NumPy and torch CPU RNG states, taken and put back in place or
through the libraries' APIs: which changed, and each put back bit for bit."""

import random

import numpy as np
import pytest
import torch

from twice.rng import layouts, snapshot
from twice.rng.snapshot import rng_changed, rng_restore, rng_snapshot


def _draws():
    return random.random(), np.random.standard_normal(), torch.randn(3)


def _same(a, b):
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


@pytest.fixture(params=["in place", "through the APIs"])
def access(request, monkeypatch):
    if request.param == "through the APIs":
        monkeypatch.setattr(layouts, "CONFIRMED", layouts.Confirmed(trusted=False))
    monkeypatch.setattr(snapshot, "READERS", {})  # readers made before were for other layouts
    return request.param


def test_a_snapshot_put_back_draws_the_same_numbers_again(access):
    random.gauss(0, 1)  # a cached Gaussian in Python's state, and one in NumPy's
    np.random.standard_normal()
    taken = rng_snapshot()
    first = _draws()
    assert rng_changed(taken, rng_snapshot()) == {"python", "numpy", "torch"}
    rng_restore(taken)
    assert rng_changed(taken, rng_snapshot()) == set()
    assert _same(_draws(), first)


def test_only_the_rngs_a_draw_touched_are_changed_and_only_those_named_are_put_back(access):
    taken = rng_snapshot()
    np.random.rand(5)
    assert rng_changed(taken, rng_snapshot()) == {"numpy"}
    torch.rand(2)
    random.random()
    moved = rng_snapshot()
    rng_restore(taken, only={"torch"})
    now = rng_snapshot()
    assert rng_changed(taken, now) == {"python", "numpy"}
    assert rng_changed(moved, now) == {"torch"}
