"""Digests of every RNG's state: they follow every draw, read in place or through the APIs, with
twice._native or without, always the same values."""

import random

import numpy as np
import pytest
import torch

import twice
from twice.rng import fingerprint, layouts
from twice.rng.fingerprint import rng_digests


def test_the_python_rng_digest_follows_every_draw_even_a_whole_state_regeneration():
    from twice.rng.layouts import _python_state_bytes

    assert _python_state_bytes() is not None  # the in-place read works on this CPython
    random.seed(3)
    seeded = rng_digests()["python"]
    state = random.getstate()
    random.random()
    assert rng_digests()["python"] != seeded
    random.setstate(state)
    assert rng_digests()["python"] == seeded
    for _ in range(624):  # the position wraps to where it was: the words must tell
        random.getrandbits(32)
    assert rng_digests()["python"] != seeded
    random.setstate(state)
    random.gauss(0, 1)  # leaves a cached second normal: part of the state
    after_gauss = rng_digests()["python"]
    random.setstate(state)
    random.getrandbits(32), random.getrandbits(32), random.getrandbits(32), random.getrandbits(32)
    assert rng_digests()["python"] != after_gauss


def test_rng_digests_read_in_place_are_those_of_the_copied_states():
    """The step trace digests Python's and NumPy's states where they lie: the values must be those
    of the bytes copied out (what earlier traces hold), through any draws, reseeds and gauss
    caches."""
    from twice.core.digests import digest_bytes
    from twice.rng.layouts import _numpy_state_bytes, _python_state_bytes

    for draw in (
        lambda: None,
        random.random,
        lambda: random.gauss(0, 1),
        lambda: np.random.rand(700),
        lambda: random.seed(5),
        lambda: np.random.seed(7),
    ):
        draw()
        digests = rng_digests()
        assert digests["python"] == digest_bytes(_python_state_bytes())
        assert digests["numpy"] == digest_bytes(_numpy_state_bytes())


def test_the_numpy_rng_digest_includes_a_cached_gaussian():
    """NumPy's legacy RNG keeps the second normal of a pair for the next call: two states with the
    same words and position but a different cached normal draw different numbers."""
    np.random.seed(4)
    np.random.standard_normal()  # one of a pair: the other is cached
    cached = np.random.get_state()
    with_gauss = rng_digests()["numpy"]
    np.random.set_state(cached[:3] + (0, 0.0))  # the same words and position, no cached normal
    assert rng_digests()["numpy"] != with_gauss
    np.random.set_state(cached[:3] + (1, cached[4] + 1.0))  # another cached normal
    assert rng_digests()["numpy"] != with_gauss
    np.random.set_state(cached)
    assert rng_digests()["numpy"] == with_gauss


def test_rng_digests_are_the_same_compiled_or_not(monkeypatch):
    import random

    import numpy as np

    from twice.core import digests
    from twice.rng import fingerprint

    random.seed(1)  # no cached Gaussian in either
    np.random.seed(1)
    plain = fingerprint.rng_digests()
    assert (
        fingerprint.rng_digests() == plain
    )  # the second call, through the items kept from the first
    random.gauss(0, 1)  # both with a cached Gaussian, which the digests cover
    np.random.standard_normal()
    compiled = fingerprint.rng_digests()
    assert compiled["python"] != plain["python"] and compiled["numpy"] != plain["numpy"]
    torch.rand(3)
    moved = fingerprint.rng_digests()
    assert moved["torch"] != compiled["torch"] and {k: moved[k] for k in ("python", "numpy")} == {
        k: compiled[k] for k in ("python", "numpy")
    }
    torch_before = torch.get_rng_state()
    monkeypatch.setattr(digests, "native", None)
    assert fingerprint.rng_digests() == moved
    random.random()
    assert fingerprint.rng_digests()["python"] != moved["python"]
    assert twice.digest(torch_before) == moved["torch"]


@pytest.mark.parametrize("missing", [0, 1, 2], ids=["python", "numpy", "both"])
def test_an_rng_state_not_read_in_place_is_still_digested_the_same(monkeypatch, missing):
    """Where a generator's layout is not confirmed (another interpreter, another NumPy), its state
    comes through getstate()/get_state(): the compiled path must still digest it, with the values
    of the path without twice._native."""
    import numpy as np

    from twice.core import digests

    random.gauss(0, 1)
    np.random.standard_normal()
    views = list(layouts.state_views())
    if missing in (0, 2):
        views[0] = None
    if missing in (1, 2):
        views[1] = views[2] = None
    views = tuple(views)
    monkeypatch.setattr(fingerprint, "state_views", lambda: views)
    assert digests.native is not None
    compiled = fingerprint.rng_digests()
    assert set(compiled) >= {"python", "numpy", "torch"}
    monkeypatch.setattr(digests, "native", None)
    assert fingerprint.rng_digests() == compiled
