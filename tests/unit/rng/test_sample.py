"""A sample's RNG states, made in place by its Seeder: SplitMix64 words each RNG reads as
written, and draws like independent uniform numbers."""

import random

import numpy as np
import torch

from unit.rng.test_splitmix import _splitmix_reference


def _reference_state(key: int, index: int, name: str) -> tuple[int, list[int]]:
    """A sample's seed and its RNG's 624 words, by the definition in sample_rng, in plain Python."""
    from twice.rng.sample import OFFSETS, SAMPLE_COUNTERS

    first = index * SAMPLE_COUNTERS
    words = []
    for counter in range(first + OFFSETS[name], first + OFFSETS[name] + 312):
        value = _splitmix_reference(key, counter)
        words += [value & 0xFFFFFFFF, value >> 32]
    return _splitmix_reference(key, first), words


def test_per_sample_states_are_splitmix64_words_that_each_rng_reads_as_written():
    from twice.rng import layouts, splitmix
    from twice.rng import sample as sample_rng

    key, indices = 2**63 + 11, np.asarray([3, 0, 12345], dtype=np.uint64)
    z = np.arange(4, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(7)
    assert splitmix.splitmix_finish(z).tolist() == [_splitmix_reference(7, c) for c in range(4)]
    seeders = {name: sample_rng.seeder(name) for name in ("python", "numpy", "torch")}
    assert all(
        one.in_place for one in seeders.values()
    )  # the layouts of this CPython, NumPy and torch are confirmed
    for one in seeders.values():
        one.prepare(key, indices, 624)
    for row, index in enumerate(indices.tolist()):
        seed, words = _reference_state(key, index, "python")
        seeders["python"].put(row)
        assert random.getstate() == (
            3,
            tuple(words) + (0,),
            None,
        )  # position 0: the next draws read these words
        seed, words = _reference_state(key, index, "numpy")
        seeders["numpy"].put(row)
        name, state, position, has_gauss, _ = np.random.get_state()
        assert state.tolist() == words and position == 0 and has_gauss == 0
        seed, words = _reference_state(key, index, "torch")
        seeders["torch"].put(row)
        assert torch.get_rng_state().numpy().tobytes() == layouts.torch_state_bytes(seed, words)
        assert torch.initial_seed() == seed


def test_per_sample_states_draw_like_independent_uniform_numbers():
    from twice.rng import sample as sample_rng

    indices = np.arange(2000, dtype=np.uint64)
    for name, draw in (("python", random.random), ("torch", lambda: torch.rand(()).item())):
        one = sample_rng.seeder(name)
        one.prepare(99, indices, 16)
        draws = []
        for row in range(len(indices)):
            one.put(row)
            draws.append((draw(), draw()))
            assert one.fits(16)
        draws = np.asarray(draws)
        assert len(set(draws[:, 0].tolist())) == len(indices), name  # no two samples share a stream
        assert abs(draws.mean() - 0.5) < 0.02 and abs(draws.var() - 1 / 12) < 0.01, name
        assert abs(np.corrcoef(draws.T)[0, 1]) < 0.08, (
            name
        )  # a sample's first and second draws unrelated
        assert abs(np.corrcoef(draws[:-1, 0], draws[1:, 0])[0, 1]) < 0.08, (
            name
        )  # neighbouring samples unrelated
