import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import twice.data


class Augmented(Dataset):
    """Draws from all three global RNGs, like random augmentations do; counts fetches."""

    def __init__(self, size=30):
        self.size, self.fetched = size, []

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        self.fetched.append(i)
        return torch.tensor([float(i), random.random(), float(np.random.rand())]) + torch.rand(3)


@pytest.fixture
def python_loop(monkeypatch):
    """The loader's Python loop, as where twice._native was not built (epoch tables are its own)."""
    monkeypatch.setattr(twice.data.samples, "native", None)


def stream(workers, epochs=2, **kwargs):
    loader = twice.data.loader(
        Augmented(), batch_size=4, shuffle=True, num_workers=workers, seed=11, **kwargs
    )
    return [batch for _ in range(epochs) for batch in loader]


def test_the_same_batches_for_0_1_2_and_4_workers():
    reference = stream(0)
    for workers in (1, 2, 4):
        other = stream(workers)
        assert len(other) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(reference, other)), workers


def test_order_depends_on_seed_and_epoch_and_epochs_differ():
    first = stream(0, epochs=2)
    assert not torch.equal(first[0], first[8])  # epoch 1 is shuffled differently from epoch 0
    other = twice.data.loader(Augmented(), batch_size=4, shuffle=True, seed=12)
    assert not torch.equal(next(iter(other)), first[0])


def test_main_process_rngs_are_left_untouched_by_sample_seeding():
    torch.manual_seed(3)
    random.seed(3)
    expected = (torch.rand(1), random.random())
    torch.manual_seed(3)
    random.seed(3)
    list(twice.data.loader(Augmented(), batch_size=5, shuffle=True, seed=1))
    assert torch.equal(torch.rand(1), expected[0]) and random.random() == expected[1]


def test_mid_epoch_resume_continues_exactly_without_fetching_skipped_samples():
    reference = stream(0)
    dataset = Augmented()
    loader = twice.data.loader(dataset, batch_size=4, shuffle=True, seed=11)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_served"] == 3
    fresh_dataset = Augmented()
    resumed = twice.data.loader(fresh_dataset, batch_size=4, shuffle=True, seed=11, num_workers=2)
    resumed.load_state_dict(state)
    rest = list(resumed) + list(resumed)
    assert (
        all(torch.equal(a, b) for a, b in zip(reference[3:], rest))
        and len(rest) == len(reference) - 3
    )
    in_process = Augmented()
    resumed_here = twice.data.loader(in_process, batch_size=4, shuffle=True, seed=11)
    resumed_here.load_state_dict(state)
    next(iter(resumed_here))
    # Constant time: the 12 samples before were never fetched (the batch is fetched twice while the
    # loader learns which RNGs the dataset draws from).
    assert len(set(in_process.fetched)) == 4 and len(in_process.fetched) == 8


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


def test_sharding_by_rank_covers_the_data_like_distributed_sampler():
    shards = [
        twice.data.loader(
            Augmented(size=10), batch_size=1, shuffle=True, seed=2, rank=r, world_size=3
        )
        for r in range(3)
    ]
    seen = [int(batch[0, 0]) for shard in shards for batch in shard]
    assert len(seen) == 12 and set(seen) == set(
        range(10)
    )  # padded to 4 per rank, every sample present
    assert all(len(shard) == 4 for shard in shards)


def test_resuming_with_other_loader_settings_is_refused():
    loader = twice.data.loader(Augmented(), batch_size=4, seed=1)
    other = twice.data.loader(Augmented(), batch_size=5, seed=1)
    with pytest.raises(ValueError, match="batch_size"):
        other.load_state_dict(loader.state_dict())


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


class Pids(Augmented):
    """Each sample also says which process fetched it."""

    def __getitem__(self, i):
        import os

        return super().__getitem__(i), os.getpid()


def test_persistent_workers_are_kept_across_epochs_and_a_mid_epoch_resume():
    """persistent_workers=True keeps the same worker processes from epoch to epoch (DataLoader's
    promise, which a DataLoader made anew each epoch would break), with the batches of 0 workers."""
    loader = twice.data.loader(
        Pids(), batch_size=4, shuffle=True, num_workers=2, seed=11, persistent_workers=True
    )
    epochs = [list(loader) for _ in range(3)]
    pids = [{pid for _, batch_pids in epoch for pid in batch_pids.tolist()} for epoch in epochs]
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]
    reference = stream(0, epochs=3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(reference, [samples for epoch in epochs for samples, _ in epoch])
    )
    # Stopped mid-epoch and resumed from its state, in the same loader and in a new one.
    iterator = iter(loader)
    first = [next(iterator)[0] for _ in range(3)]
    state = loader.state_dict()
    rest = [samples for samples, _ in loader]
    fresh = twice.data.loader(
        Pids(), batch_size=4, shuffle=True, num_workers=2, seed=11, persistent_workers=True
    )
    fresh.load_state_dict(state)
    again = [samples for samples, _ in fresh]
    epoch3 = stream(0, epochs=4)[24:]
    assert len(first + rest) == len(epoch3) == 8
    assert all(torch.equal(a, b) for a, b in zip(epoch3, first + rest))
    assert all(torch.equal(a, b) for a, b in zip(epoch3[3:], again))


def test_an_iterable_dataset_is_refused_with_a_hint():
    from torch.utils.data import IterableDataset

    from twice.core.errors import UsageError

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    for dataset in (Stream(), iter(range(3))):
        with pytest.raises(UsageError, match="map-style dataset") as caught:
            twice.data.loader(dataset, batch_size=2)
        assert "position" in caught.value.hint


def test_out_of_order_batches_are_refused():
    """in_order=False (DataLoader yields batches as workers finish them) would make the stream
    depend on timing."""
    with pytest.raises(ValueError, match="in_order=False"):
        twice.data.loader(Augmented(), batch_size=2, num_workers=2, in_order=False)
    assert (
        len(list(twice.data.loader(Augmented(), batch_size=2, num_workers=2, in_order=True))) == 15
    )


def test_unbatched_samples_with_batch_size_none_are_the_batched_ones_and_resume():
    """batch_size=None (DataLoader's samples one by one, not collated into batches) serves the
    samples of batch_size=1, and its position counts samples."""
    batched = [
        batch[0] for batch in twice.data.loader(Augmented(), batch_size=1, shuffle=True, seed=11)
    ]
    loader = twice.data.loader(Augmented(), batch_size=None, shuffle=True, seed=11)
    assert len(loader) == 30
    single = list(loader)
    assert len(single) == 30 and all(torch.equal(a, b) for a, b in zip(batched, single))
    again = twice.data.loader(Augmented(), batch_size=None, shuffle=True, seed=11)
    iterator = iter(again)
    head = [next(iterator) for _ in range(7)]
    resumed = twice.data.loader(Augmented(), batch_size=None, shuffle=True, seed=11)
    resumed.load_state_dict(again.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(head + list(resumed), single))


def test_a_state_that_is_not_a_loaders_is_refused_naming_what_it_lacks():
    loader = twice.data.loader(Augmented(), batch_size=4)
    with pytest.raises(ValueError, match="lacks batches_served, seed"):
        loader.load_state_dict({"epoch": 1})


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


def test_resuming_over_a_dataset_of_another_size_is_refused():
    """The position of a loader over 30 samples says nothing about a dataset of 31: refused, not
    misapplied."""
    state = twice.data.loader(Augmented(30), batch_size=4, shuffle=True, seed=11).state_dict()
    with pytest.raises(
        ValueError, match="the dataset has 31 samples; the checkpoint's loader had 30"
    ):
        twice.data.loader(Augmented(31), batch_size=4, shuffle=True, seed=11).load_state_dict(state)
    older = {
        key: value for key, value in state.items() if key != "samples"
    }  # saved before sizes were recorded
    twice.data.loader(Augmented(30), batch_size=4, shuffle=True, seed=11).load_state_dict(older)


def weighted(size=30):
    """Class-imbalance sampling: indices drawn with replacement, by weight (its own generator:
    None)."""
    return torch.utils.data.WeightedRandomSampler(
        torch.linspace(0.1, 1.0, size), 40, replacement=True
    )


def sampled(workers, sampler=None, epochs=2, **kwargs):
    loader = twice.data.loader(
        Augmented(),
        batch_size=4,
        sampler=sampler or weighted(),
        num_workers=workers,
        seed=11,
        **kwargs,
    )
    return [batch for _ in range(epochs) for batch in loader]


def test_a_users_sampler_is_seeded_per_epoch_the_same_for_any_workers_and_resumes_mid_epoch():
    torch.manual_seed(1)  # the global state the sampler would otherwise draw from
    reference = sampled(0)
    torch.manual_seed(2)
    assert all(torch.equal(a, b) for a, b in zip(reference, sampled(2)))
    assert len(reference) == 20 and not torch.equal(
        torch.cat(reference[:10]), torch.cat(reference[10:])
    )  # epochs differ
    loader = twice.data.loader(Augmented(), batch_size=4, sampler=weighted(), seed=11)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(3)]
    resumed = twice.data.loader(Augmented(), batch_size=4, sampler=weighted(), seed=11)
    resumed.load_state_dict(loader.state_dict())
    tail = list(resumed) + list(resumed)
    assert all(torch.equal(a, b) for a, b in zip(head + tail, reference)) and len(head + tail) == 20


def test_an_index_a_sampler_repeats_gets_augmentations_of_its_own_each_time():
    """With replacement an index comes up several times an epoch: each time is another sample's
    worth of randomness, not a copy of the first (a stream per repeat)."""
    rows = torch.cat(sampled(0, epochs=1)).tolist()
    draws: dict = {}
    for row in rows:
        draws.setdefault(int(row[0]), []).append(
            tuple(row)
        )  # column 0: the index plus a torch.rand() draw
    repeated = [d for d in draws.values() if len(d) > 1]
    assert repeated and all(len(set(d)) == len(d) for d in repeated)


def test_a_sampler_drawing_from_the_global_rng_is_seeded_and_leaves_it_untouched():
    class GlobalShuffle(torch.utils.data.Sampler):
        def __len__(self):
            return 30

        def __iter__(self):
            return iter(torch.randperm(30).tolist())  # no generator attribute: the global RNG

    torch.manual_seed(5)
    before = torch.get_rng_state()
    first = sampled(0, GlobalShuffle(), epochs=1)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(6)
    assert all(torch.equal(a, b) for a, b in zip(first, sampled(0, GlobalShuffle(), epochs=1)))


def test_a_users_sampler_is_sharded_by_rank():
    shares = [
        [int(x) for x in torch.cat(sampled(0, rank=r, world_size=2, epochs=1))[:, 0]]
        for r in range(2)
    ]
    whole = [
        int(i)
        for i in twice.data.loader(
            Augmented(), batch_size=4, sampler=weighted(), seed=11
        ).sampler.order(0)
    ]
    assert sorted(shares[0] + shares[1]) == sorted(whole) and len(shares[0]) == len(shares[1]) == 20


def test_a_sampler_of_batches_or_beside_shuffle_is_refused():
    from twice.core.errors import UsageError

    with pytest.raises(UsageError, match="yielded \\[0, 1\\], not a sample index"):
        list(twice.data.loader(Augmented(), sampler=[[0, 1], [2, 3]], seed=1))
    with pytest.raises(ValueError, match="sampler and shuffle=True"):
        twice.data.loader(Augmented(), sampler=weighted(), shuffle=True)


def test_resuming_with_a_sampler_that_draws_another_order_is_refused():
    loader = twice.data.loader(Augmented(), batch_size=4, sampler=weighted(), seed=11)
    next(iter(loader))
    state = loader.state_dict()
    reweighted = torch.utils.data.WeightedRandomSampler(
        torch.linspace(1.0, 0.1, 30), 40, replacement=True
    )
    for other in (
        twice.data.loader(Augmented(), batch_size=4, sampler=reweighted, seed=11),
        twice.data.loader(Augmented(), batch_size=4, seed=11),
    ):
        with pytest.raises(ValueError, match="drew its order from a sampler"):
            other.load_state_dict(state)
    same = twice.data.loader(Augmented(), batch_size=4, sampler=weighted(), seed=11)
    same.load_state_dict(state)
    assert same.batches_served == 1


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_started_by_spawn_or_forkserver_give_the_same_batches(context):
    """spawn is the default start method on macOS and Windows: the workers get the loader's
    per-sample seeding by pickle, not by inheriting the parent's memory."""
    reference = stream(0, epochs=1)
    other = stream(2, epochs=1, multiprocessing_context=context)
    assert len(other) == len(reference) and all(torch.equal(a, b) for a, b in zip(reference, other))


def test_an_endless_sampler_gives_epochs_of_its_length_and_one_without_a_length_is_refused():
    from twice.core.errors import UsageError

    class Endless(torch.utils.data.Sampler):
        """Like detectron2's TrainingSampler: an endless stream of shuffled indices."""

        def __init__(self, length=None):
            self.length = length

        def __iter__(self):
            while True:
                yield from torch.randperm(30).tolist()

    class Sized(Endless):
        def __len__(self):
            return 12

    batches = sampled(0, Sized(), epochs=2)
    assert len(batches) == 6 and not torch.equal(torch.cat(batches[:3]), torch.cat(batches[3:]))
    with pytest.raises(UsageError, match="has no length"):
        list(twice.data.loader(Augmented(), batch_size=4, sampler=Endless(), seed=1))


class Sequences(Dataset):
    """Variable-length samples with a random offset (torch's RNG), as in NLP or speech."""

    lengths = [3 + (i * 7) % 11 for i in range(40)]

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((self.lengths[i],), float(i)) + torch.rand(1)


class Buckets(torch.utils.data.Sampler):
    """Length bucketing: batches of 8 similar lengths, the batches shuffled from the global RNG."""

    def __init__(self):
        self.order = sorted(range(40), key=lambda i: Sequences.lengths[i])

    def __len__(self):
        return 5

    def __iter__(self):
        batches = [self.order[i : i + 8] for i in range(0, 40, 8)]
        return iter([batches[j] for j in torch.randperm(5).tolist()])


def padded(batch):
    width = max(len(x) for x in batch)
    return torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in batch])


def bucketed(workers=0, epochs=2, **kwargs):
    loader = twice.data.loader(
        Sequences(),
        batch_sampler=Buckets(),
        collate_fn=padded,
        seed=4,
        num_workers=workers,
        **kwargs,
    )
    return [batch for _ in range(epochs) for batch in loader]


def test_a_batch_sampler_bucketing_by_length_gives_the_same_batches_for_any_workers_and_resumes():
    torch.manual_seed(1)
    reference = bucketed(0)
    assert [b.shape[0] for b in reference] == [8] * 10 and len(
        {b.shape[1] for b in reference[:5]}
    ) > 1
    torch.manual_seed(2)
    assert all(torch.equal(a, b) for a, b in zip(reference, bucketed(2)))
    assert [b.shape for b in reference[:5]] != [
        b.shape for b in reference[5:]
    ]  # each epoch its own batch order
    loader = twice.data.loader(Sequences(), batch_sampler=Buckets(), collate_fn=padded, seed=4)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(2)]
    resumed = twice.data.loader(Sequences(), batch_sampler=Buckets(), collate_fn=padded, seed=4)
    resumed.load_state_dict(loader.state_dict())
    assert len(resumed) == 5
    tail = list(resumed) + list(resumed)
    assert len(head + tail) == 10 and all(torch.equal(a, b) for a, b in zip(head + tail, reference))
    # Sharded by whole batches, padded like DistributedSampler: 5 batches give each of 2 ranks 3.
    shares = [bucketed(epochs=1, rank=rank, world_size=2) for rank in (0, 1)]
    assert [len(share) for share in shares] == [3, 3]
    assert all(
        torch.equal(a, b)
        for a, b in zip(shares[0] + shares[1][:2], [reference[i] for i in (0, 2, 4, 1, 3)])
    )


def test_a_batch_sampler_beside_batch_size_or_shuffle_or_yielding_indices_is_refused():
    from twice.core.errors import UsageError

    for extra in ({"batch_size": 4}, {"shuffle": True}, {"drop_last": True}):
        with pytest.raises(ValueError, match="batch_sampler chooses the batches"):
            twice.data.loader(Sequences(), batch_sampler=Buckets(), **extra)
    with pytest.raises(
        UsageError,
        match="batch_sampler given to twice.data.loader yielded 0, not a batch of indices",
    ):
        list(twice.data.loader(Sequences(), batch_sampler=list(range(40)), seed=1))


def test_an_epoch_served_to_its_end_is_saved_as_the_next_epochs_start():
    """A loop that checkpoints after the last batch and one that stops at the next fetch (a
    stopped or resumed run) save the same state, and both go on with the same batches."""
    data = torch.utils.data.TensorDataset(torch.arange(12.0))
    loader = twice.data.loader(data, batch_size=4, shuffle=True, seed=3)
    seen = [batch[0].tolist() for batch in loader]  # epoch 0: three batches
    inside = twice.data.loader(data, batch_size=4, shuffle=True, seed=3)
    for _ in inside:
        state = inside.state_dict()  # the last one: after the epoch's last batch
    assert state["epoch"] == 1 and state["batches_served"] == 0
    after = twice.data.loader(data, batch_size=4, shuffle=True, seed=3)
    after.load_state_dict(state)
    straight = [batch[0].tolist() for batch in loader]  # epoch 1, continued
    assert [batch[0].tolist() for batch in after] == straight and seen != straight
