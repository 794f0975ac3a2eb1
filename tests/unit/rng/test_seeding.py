import random

import numpy as np
import pytest
import torch

import twice
from twice.rng.fingerprint import rng_digests
from twice.rng.seeding import capture_rng, restore_rng


def draws():
    return (random.random(), np.random.rand(3).tobytes(), torch.rand(3), torch.randn(2, 2))


def test_every_rng_gives_identical_draws_after_seeding_twice():
    seeded = twice.seed_everything(123)
    first = draws()
    twice.seed_everything(123)
    second = draws()
    assert {"python", "numpy", "torch"} <= set(seeded)
    assert first[0] == second[0] and first[1] == second[1]
    assert torch.equal(first[2], second[2]) and torch.equal(first[3], second[3])


def test_different_seeds_give_different_draws():
    twice.seed_everything(1)
    a = draws()
    twice.seed_everything(2)
    b = draws()
    assert a[0] != b[0] and a[1] != b[1] and not torch.equal(a[2], b[2])


def test_seeds_wider_than_32_bits_reach_numpy():
    twice.seed_everything(2**40 + 5)
    a = np.random.rand()
    twice.seed_everything(2**40 + 6)
    assert np.random.rand() != a


@pytest.mark.parametrize("bad", [-1, 2**64, 1.0, "3", True])
def test_seed_everything_rejects_bad_seeds(bad):
    with pytest.raises(ValueError):
        twice.seed_everything(bad)


def test_capture_and_restore_rng_round_trip_every_source():
    twice.seed_everything(5)
    state = capture_rng()
    before = rng_digests()
    a = draws()
    restore_rng(state)
    assert rng_digests() == before
    b = draws()
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_context_manager_restores_settings_and_rng_even_when_the_body_raises():
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    random.seed(99)
    expected_next = random.Random()
    expected_next.setstate(random.getstate())
    with pytest.raises(ZeroDivisionError):
        with twice.deterministic(seed=0, mode="warn"):
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.backends.cudnn.benchmark is False
            random.random()
            1 / 0  # noqa: B018
    assert torch.are_deterministic_algorithms_enabled() is False
    assert torch.backends.cudnn.benchmark is True
    assert random.random() == expected_next.random()


def test_an_rng_state_that_is_a_view_at_an_offset_restores_that_state():
    # torch's set_state reads from the start of the storage: a row of stacked states would restore
    # row 0's state, or crash the process. Run where a crash cannot take the test session with it.
    code = """
import torch
from twice.rng.seeding import capture_rng, restore_rng
import twice.checkpoint.kinds
torch.manual_seed(0)
first = torch.get_rng_state()
torch.manual_seed(1)
state = capture_rng()
expected = torch.rand(3)
state["torch"] = torch.stack([first, state["torch"]])[1]
restore_rng(state)
assert torch.equal(torch.rand(3), expected), "restore_rng"
generator = torch.Generator().manual_seed(1)
stacked = torch.stack([first, generator.get_state()])
expected = torch.rand(3, generator=generator)
kind = twice.checkpoint.kinds.kind_named("torch_generator", "g", "test")
kind.restore(generator, stacked[1], "g")
assert torch.equal(torch.rand(3, generator=generator), expected), "checkpoint"
print("ok")
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
