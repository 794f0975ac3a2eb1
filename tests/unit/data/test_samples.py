"""Each sample's RNGs seeded from its key (epoch, index): the batches of seeding every RNG for
the RNGs a dataset draws from, in place or through the libraries' APIs, compiled or in Python,
the main process's RNGs left untouched."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import twice.data
from twice.data.samples import SeededSamples
from unit.data.test_loading import Augmented, stream
from unit.data.test_sampler import weighted


class Sometimes(Dataset):
    """Draws from Python's random for a few samples only, from torch's for all, from NumPy's
    never."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        extra = random.random() if i % 13 == 5 else 0.0
        return torch.tensor([float(i), extra]) + torch.rand(2)


@pytest.mark.parametrize(
    "dataset",
    [Augmented, Sometimes, lambda: torch.utils.data.TensorDataset(torch.arange(30.0))],
    ids=["every-rng", "some-samples", "no-rng"],
)
def test_seeding_only_the_rngs_a_dataset_draws_from_gives_the_batches_of_seeding_all(dataset):
    def batches(workers, every):
        data = twice.data.loader(
            dataset(), batch_size=4, shuffle=True, seed=5, num_workers=workers, seed_every_rng=every
        )
        return [b for _ in range(2) for b in data]

    reference = batches(0, True)
    for workers in (0, 2):
        lazy = batches(workers, False)
        assert len(lazy) == len(reference)
        assert all(
            torch.equal(
                torch.as_tensor(a[0] if isinstance(a, list) else a),
                torch.as_tensor(b[0] if isinstance(b, list) else b),
            )
            for a, b in zip(reference, lazy)
        ), workers


def test_the_loader_learns_which_rngs_the_dataset_draws_from():
    data = twice.data.loader(Sometimes(), batch_size=4, shuffle=False, seed=5)
    iterator = iter(data)
    next(iterator)
    assert data._samples.used == {"torch"}  # samples 0-3 draw only from torch
    for _ in iterator:
        pass
    assert data._samples.used == {
        "torch",
        "python",
    }  # sample 5 drew from random; NumPy never seeded
    torch.manual_seed(1)
    expected = torch.rand(1)
    torch.manual_seed(1)
    list(twice.data.loader(Sometimes(), batch_size=4, shuffle=True, seed=5))
    assert torch.equal(
        torch.rand(1), expected
    )  # learning (a batch fetched again) left the loop's RNG alone


def _unconfirmed_layouts(monkeypatch):
    """Make this process's RNG layouts unconfirmed: every state goes through the libraries' own
    API."""
    from twice.rng import layouts, snapshot
    from twice.rng import sample as sample_rng

    monkeypatch.setattr(layouts, "CONFIRMED", layouts.Confirmed(trusted=False))
    # readers and seeders made before were for the in-place layouts
    monkeypatch.setattr(snapshot, "READERS", {})
    monkeypatch.setattr(sample_rng, "SEEDERS", {})


def test_where_rng_layouts_are_not_confirmed_the_loader_sets_the_same_states_through_the_apis(
    monkeypatch,
):
    from twice.rng import sample as sample_rng

    fast = stream(0, epochs=1)
    assert all(
        sample_rng.seeder(name).in_place for name in ("python", "numpy", "torch")
    )  # confirmed on this build
    _unconfirmed_layouts(monkeypatch)
    assert not any(sample_rng.seeder(name).in_place for name in ("python", "numpy", "torch"))
    slow = stream(0, epochs=1)
    assert all(
        torch.equal(a, b) for a, b in zip(fast, slow)
    )  # the same numbers: a state is the seed's words
    assert all(torch.equal(a, b) for a, b in zip(slow, stream(2, epochs=1)))


class Greedy(Dataset):
    """Samples drawing from none to more than a whole MT19937 block of words from each RNG: 630
    words
    regenerate the block and leave the position at 6, where a sample that drew 6 words would be."""

    DRAWS = {
        1: 3,
        2: 17,
        3: 40,
        5: 315,
        6: 630,
        9: 100,
    }  # index -> words drawn (sample 6: past a block)

    def __len__(self):
        return 12

    def __getitem__(self, i):
        n = self.DRAWS.get(i, 0)
        python = [random.getrandbits(32) for _ in range(n)]
        numpy = np.random.randint(0, 2**32, n, dtype=np.uint64).tolist()
        values = [float(sum(python) % 9973), float(sum(numpy) % 9973)]
        return torch.cat(
            [
                torch.tensor(values, dtype=torch.float64),
                torch.rand(n, dtype=torch.float64).sum().reshape(1),
            ]
        )


def test_samples_reading_past_the_fresh_words_get_the_numbers_of_complete_states(monkeypatch):
    def batches(workers):
        data = twice.data.loader(Greedy(), batch_size=3, shuffle=True, seed=4, num_workers=workers)
        return [b for _ in range(2) for b in data], data

    fast, data = batches(0)
    # The process started with a few fresh words per sample and made more as samples read past them;
    # sample 6 regenerated a block, so every word is made fresh now.
    assert data._samples.words == {"python": 624, "numpy": 624, "torch": 624}
    assert all(torch.equal(a, b) for a, b in zip(fast, batches(2)[0]))
    _unconfirmed_layouts(monkeypatch)
    complete = batches(0)[0]  # through the API: every state complete from the first sample
    assert all(torch.equal(a, b) for a, b in zip(fast, complete))


class TorchGreedy(Dataset):
    """Greedy's draws from torch's RNG alone (the loader's inlined path): 630 words regenerate
    the block."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.rand(Greedy.DRAWS.get(i, 0), dtype=torch.float64).sum().reshape(
            1
        ) + torch.randn(1, dtype=torch.float64)


@pytest.mark.parametrize(
    "draws", [{1: 3, 2: 40}, Greedy.DRAWS], ids=["within-a-block", "past-a-block"]
)
def test_samples_reading_past_the_fresh_words_of_torch_alone_get_the_numbers_of_complete_states(
    monkeypatch, draws
):
    monkeypatch.setattr(Greedy, "DRAWS", draws)

    def batches(workers):
        data = twice.data.loader(
            TorchGreedy(), batch_size=3, shuffle=True, seed=4, num_workers=workers
        )
        return [b for _ in range(2) for b in data], data

    fast, data = batches(0)
    assert data._samples.used == {"torch"} and data._samples.words == {
        "torch": 624 if 6 in draws else 128
    }  # 40 doubles: 80+ words
    assert all(torch.equal(a, b) for a, b in zip(fast, batches(2)[0]))
    _unconfirmed_layouts(monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(fast, batches(0)[0]))


class ForksRng(Dataset):
    """Reads and restores torch's RNG state inside a sample, as torch.random.fork_rng does."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        with (
            torch.random.fork_rng()
        ):  # get_rng_state() of the sample's state, set_rng_state() of it after
            torch.rand(3)
        return torch.rand(2) + torch.initial_seed() % 1000


def test_a_sample_can_read_and_set_back_the_state_it_was_given():
    # The states written in place must be ones torch's own set_rng_state accepts (left 624, next 0).
    from twice.rng import sample as sample_rng

    assert sample_rng.seeder("torch").in_place

    def batches(workers):
        return list(
            twice.data.loader(ForksRng(), batch_size=4, shuffle=True, seed=2, num_workers=workers)
        )

    batches, again = batches(0), batches(2)
    assert len(batches) == 2 and all(torch.equal(a, b) for a, b in zip(batches, again))
    assert (
        len({float(b[0, 0]) for b in batches} | {float(b[1, 0]) for b in batches}) == 4
    )  # per-sample seeds differ


class Normals(Dataset):
    """Normals from every RNG, one a sample: each RNG keeps the second of the pair it made for the
    next draw (Python's gauss_next, NumPy's cached Gaussian, torch's cached normal); the next
    sample must not be given it."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor(
            [random.gauss(0, 1), float(np.random.standard_normal())], dtype=torch.float64
        ) + torch.randn(1, dtype=torch.float64)


@pytest.mark.parametrize("make", [Augmented, Greedy, TorchGreedy, Normals, "sampler"])
def test_the_compiled_loop_gives_the_samples_of_the_python_loop(monkeypatch, make):
    # The loop in C (twice._native) makes each sample's states itself: the same numbers as the
    # Python loop's NumPy-made states, with the same fresh words learnt, for every way a sample
    # draws.
    assert (
        twice.data.samples.native is not None
    )  # built at install (setup.py); else only the Python loop is tested
    calls = []
    compiled = twice.data.samples.native

    class Counting:
        def fetch(self, *args):
            calls.append(len(args[1]))
            return compiled.fetch(*args)

    def batches():
        sampler = (
            weighted() if make == "sampler" else None
        )  # a user's sampler: a stream per repeat of an index
        dataset = Augmented() if make == "sampler" else make()
        data = twice.data.loader(
            dataset, batch_size=3, shuffle=sampler is None, sampler=sampler, seed=5
        )
        return [b for _ in range(2) for b in data], data._samples.words, data._samples.used

    torch.manual_seed(0)
    monkeypatch.setattr(twice.data.samples, "native", Counting())
    fast = batches()
    assert calls  # the compiled loop did fetch them
    torch.manual_seed(0)
    monkeypatch.setattr(twice.data.samples, "native", None)
    slow = batches()
    assert fast[1:] == slow[1:] and len(fast[0]) == len(slow[0]) > 0
    assert all(torch.equal(a, b) for a, b in zip(fast[0], slow[0]))


def test_an_epoch_of_values_made_at_once_gives_the_samples_made_batch_by_batch(
    monkeypatch, python_loop
):
    from twice.rng import sample as sample_rng

    at_once = stream(0, epochs=2)  # 30 samples: the epoch's values are made at its first batch
    assert sample_rng.TABLES
    monkeypatch.setattr(sample_rng, "TABLE_VALUES", 0)
    monkeypatch.setattr(sample_rng, "TABLES", {})
    assert all(torch.equal(a, b) for a, b in zip(at_once, stream(0, epochs=2)))
    assert not sample_rng.TABLES  # batch by batch this time


def test_loaders_used_in_turn_keep_their_epoch_tables(monkeypatch, python_loop):
    from twice.rng import sample as sample_rng

    made = []
    values = sample_rng.sample_values

    def spy(*args, keep=True):
        made.append(keep)
        return values(*args, keep=keep)

    monkeypatch.setattr(sample_rng, "sample_values", spy)
    monkeypatch.setattr(sample_rng, "TABLES", {})
    first = twice.data.loader(Augmented(), batch_size=4, shuffle=True, seed=1)
    second = twice.data.loader(Augmented(), batch_size=4, shuffle=True, seed=2)
    pairs = list(zip(first, second))
    assert (
        len(pairs) == 8 and made.count(False) == 2
    )  # one table per loader's epoch, not one per batch
    alone = list(twice.data.loader(Augmented(), batch_size=4, shuffle=True, seed=2))
    assert all(torch.equal(b, c) for (_, b), c in zip(pairs, alone))


def test_loaders_with_one_seed_over_datasets_of_other_sizes_each_get_their_own_samples():
    # An epoch's table of values belongs to a dataset size too: a bigger dataset with the same seed
    # must not be served from a smaller one's table (it once raised IndexError).
    small = list(twice.data.loader(Augmented(size=8), batch_size=4, shuffle=True, seed=9))
    big = list(twice.data.loader(Augmented(size=40), batch_size=4, shuffle=True, seed=9))
    assert len(small) == 2 and len(big) == 10
    alone = {int(b[k, 0]): b[k] for b in big for k in range(len(b))}
    assert all(
        torch.equal(b[k], alone[int(b[k, 0])]) for b in small for k in range(len(b))
    )  # values of (seed, epoch, index)


def test_a_few_fresh_words_suffice_for_samples_that_draw_a_few_numbers():
    data = twice.data.loader(Augmented(), batch_size=4, shuffle=True, seed=3)
    list(data)
    assert set(data._samples.words.values()) <= {
        16
    }  # each sample drew 1-2 words per RNG: no batch fetched again


def test_a_sample_that_raises_leaves_the_main_process_rngs_untouched():
    """A loop that skips bad samples (catching the error) must find its RNGs where they were."""

    class Bad(Augmented):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            if i == 7:
                raise ValueError("bad sample")
            return sample

    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    expected = (torch.rand(1), random.random(), np.random.rand())
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    with pytest.raises(ValueError, match="bad sample"):
        list(twice.data.loader(Bad(10), batch_size=5, seed=1))
    assert (
        torch.equal(torch.rand(1), expected[0])
        and random.random() == expected[1]
        and np.random.rand() == expected[2]
    )


class MixUp:
    """A collate_fn that draws random numbers (MixUp-style): a weight from each global RNG."""

    def __call__(self, samples):
        batch = torch.stack(samples)
        weight = torch.rand(()) * 0.5 + random.random() * 0.25 + float(np.random.rand()) * 0.25
        return weight * batch + (1 - weight) * batch.flip(0)


def test_a_collate_fn_drawing_random_numbers_gives_the_same_batches_for_any_workers_and_resume():
    """MixUp/CutMix in collate_fn draw outside any sample: seeded per batch once seen drawing, so
    the
    batches match for 0, 2 and 4 workers and after a mid-epoch resume, and the loop's RNGs stay
    put."""

    def batches(workers, epochs=2):
        loader = twice.data.loader(
            Augmented(),
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            seed=11,
            collate_fn=MixUp(),
        )
        return [batch for _ in range(epochs) for batch in loader]

    torch.manual_seed(5)
    expected_next = torch.rand(1)
    torch.manual_seed(5)
    reference = batches(0)
    assert torch.equal(torch.rand(1), expected_next)
    for workers in (2, 4):
        other = batches(workers)
        assert len(other) == len(reference) and all(
            torch.equal(a, b) for a, b in zip(reference, other)
        ), workers
    plain = stream(0)
    assert not any(
        torch.equal(a, b) for a, b in zip(reference, plain)
    )  # the collate did change the batches
    loader = twice.data.loader(Augmented(), batch_size=4, shuffle=True, seed=11, collate_fn=MixUp())
    iterator = iter(loader)
    head = [next(iterator) for _ in range(3)]
    resumed = twice.data.loader(
        Augmented(), batch_size=4, shuffle=True, seed=11, collate_fn=MixUp()
    )
    resumed.load_state_dict(loader.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(head + list(resumed), reference))


def test_a_collate_fn_drawing_nothing_is_run_once_per_batch():
    calls = []

    def collate(samples):
        calls.append(len(samples))
        return torch.stack(samples)

    batches = list(twice.data.loader(Augmented(), batch_size=4, seed=11, collate_fn=collate))
    default = list(twice.data.loader(Augmented(), batch_size=4, seed=11))
    assert calls == [4] * 7 + [2] and all(torch.equal(a, b) for a, b in zip(batches, default))


class _Draws(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return (i, random.random(), float(np.random.rand()), float(torch.rand(())))


def test_a_samples_numbers_depend_on_its_key_only_never_on_the_batch_or_the_order():
    fetched = SeededSamples(_Draws(), seed=5)
    batch = fetched.__getitems__([(0, 4), (0, 1), (1, 4)])
    alone = SeededSamples(_Draws(), seed=5)[(0, 1)]
    assert batch[1] == alone and batch[0] != batch[2]  # epoch 1's index 4 draws anew
    assert fetched.used == frozenset(SeededSamples.RNGS)  # it saw the dataset draw from all three
    assert SeededSamples(_Draws(), seed=6)[(0, 1)] != alone


def test_fetching_gives_the_callers_rngs_back():
    torch.manual_seed(2)
    random.seed(2)
    expected = (torch.rand(1), random.random())
    torch.manual_seed(2)
    random.seed(2)
    SeededSamples(_Draws(), seed=5, seed_every_rng=True).__getitems__([(0, 0), (0, 3)])
    assert torch.equal(torch.rand(1), expected[0]) and random.random() == expected[1]
