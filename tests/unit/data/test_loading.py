"""The resumable loader: the same batches for any number of workers, resumed mid-epoch, refusing
what it cannot continue (its order: test_sampler.py; each sample's RNGs: test_samples.py)."""

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


def test_resuming_with_other_loader_settings_is_refused():
    loader = twice.data.loader(Augmented(), batch_size=4, seed=1)
    other = twice.data.loader(Augmented(), batch_size=5, seed=1)
    with pytest.raises(ValueError, match="batch_size"):
        other.load_state_dict(loader.state_dict())


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


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_started_by_spawn_or_forkserver_give_the_same_batches(context):
    """spawn is the default start method on macOS and Windows: the workers get the loader's
    per-sample seeding by pickle, not by inheriting the parent's memory."""
    reference = stream(0, epochs=1)
    other = stream(2, epochs=1, multiprocessing_context=context)
    assert len(other) == len(reference) and all(torch.equal(a, b) for a, b in zip(reference, other))


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


def test_the_loader_counts_its_batches_and_saves_where_it_is():
    from twice.data.loading import ResumableLoader

    loader = ResumableLoader(Augmented(10), batch_size=4, shuffle=True, seed=2)
    assert len(loader) == 3 and loader.epoch == 0
    assert len(ResumableLoader(Augmented(10), batch_size=4, seed=2, drop_last=True)) == 2
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_served"], state["samples"]) == (0, 1, 10)
    assert (state["seed"], state["batch_size"], state["world_size"]) == (2, 4, 1)
    loader.set_epoch(5)
    assert loader.state_dict()["epoch"] == 5 and loader.state_dict()["batches_served"] == 0
