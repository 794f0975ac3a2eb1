"""SplitMix64's output function over NumPy arrays, against its definition in plain integers."""

import numpy as np

from twice.rng.splitmix import splitmix_finish


def _splitmix_reference(state: int, counter: int) -> int:
    """SplitMix64 output `counter` of the sequence starting at `state`, in plain Python integers."""
    z = (state + counter * 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return z ^ (z >> 31)


def test_the_finish_is_splitmix64_of_each_counter_in_place():
    z = np.arange(1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(2**63 + 5)
    out = splitmix_finish(z)
    assert out is z  # in place
    assert z.tolist() == [_splitmix_reference(2**63 + 5, c) for c in range(1000)]


def test_a_reused_scratch_buffer_gives_the_same_words():
    base = np.arange(64, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    fresh = splitmix_finish(base.copy())
    assert np.array_equal(splitmix_finish(base.copy(), reuse=True), fresh)
    assert np.array_equal(splitmix_finish(base.copy(), reuse=True), fresh)
    assert len(set(fresh.tolist())) == 64  # bijective in the counter: no two alike
