import ctypes
import random
import struct

import numpy as np
import pytest
import torch

import twice
from twice.rng import layouts
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


def _splitmix_reference(state: int, counter: int) -> int:
    """SplitMix64 output `counter` of the sequence starting at `state`, in plain Python integers."""
    z = (state + counter * 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return z ^ (z >> 31)


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


def test_a_torch_generator_state_written_in_place_draws_like_the_same_state_set_officially():

    layout, address = layouts.torch_layout(), layouts.torch_state_address()
    assert layout is not None and address is not None
    words = np.random.default_rng(5).integers(0, 2**32, 624, dtype=np.uint64).tolist()
    official = layouts.torch_state_bytes(99, words, left=300, next_=324)
    cached = bytearray(
        official
    )  # a state holding cached normals (float and double): the write must clear them
    struct.pack_into("<dddi", cached, 5016, 0.25, 7.5, 7.5, 1)
    struct.pack_into("<f?", cached, 5048, 7.5, True)
    torch.set_rng_state(torch.frombuffer(cached, dtype=torch.uint8))
    image = bytearray(layout.template)
    struct.pack_into("<QiB3xI", image, 0, 99, 300, 1, 324)
    struct.pack_into("<624I", image, layout.words, *words)
    ctypes.memmove(address, bytes(image), layout.size)
    drawn = (
        torch.randn(()),
        torch.randn((), dtype=torch.float64),
        torch.rand(1000),
        torch.randint(0, 2**40, (7,)),
    )
    torch.set_rng_state(torch.frombuffer(bytearray(official), dtype=torch.uint8))
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            drawn,
            (
                torch.randn(()),
                torch.randn((), dtype=torch.float64),
                torch.rand(1000),
                torch.randint(0, 2**40, (7,)),
            ),
        )
    )


def test_memory_is_offered_to_the_kernel_before_it_is_read_in_place():

    buffer = ctypes.create_string_buffer(3072)
    assert layouts.readable(ctypes.addressof(buffer), 3072)
    assert not layouts.readable(16, 3072)  # the first page is never mapped: an error, not a crash


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
