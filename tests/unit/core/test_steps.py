"""core.steps.RoundClock: where a step (a round of optimizer updates) ends."""

from hypothesis import given
from hypothesis import strategies as st

from twice.core.steps import RoundClock


def test_one_optimizer_ends_a_round_at_every_step_once_it_repeats():
    clock = RoundClock()
    assert clock.closes(1) is False and clock.add(1) is False  # size unknown until it repeats
    assert clock.closes(1) is True and clock.size == 1
    clock.reset()
    assert clock.add(1) is True  # from now on every step completes a round


def test_a_gan_round_is_both_optimizers():
    clock = RoundClock()
    for key in (1, 2):
        assert not clock.closes(key)
        clock.add(key)
    assert clock.closes(1) and clock.size == 2
    clock.reset()
    assert clock.add(1) is False and clock.add(2) is True


@given(st.integers(1, 6), st.integers(2, 20))
def test_rounds_of_k_optimizers_count_one_step_per_k_calls(k, rounds):
    clock, ended = RoundClock(), 0
    for _ in range(rounds):
        for key in range(k):
            if clock.closes(key):
                clock.reset()
                ended += 1
            if clock.add(key):
                clock.reset()
                ended += 1
    assert ended + (1 if clock.members else 0) == rounds
