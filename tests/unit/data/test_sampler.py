"""The loader's order, a function of (seed, epoch) only: shuffled, sharded by rank, and a user's
own sampler or batch sampler drawn from under a seed of its own."""

import pytest
import torch
from torch.utils.data import Dataset

import twice.data
from twice.data.sampler import BatchKeys, EpochSampler
from unit.data.test_loading import Augmented, stream


def test_order_depends_on_seed_and_epoch_and_epochs_differ():
    first = stream(0, epochs=2)
    assert not torch.equal(first[0], first[8])  # epoch 1 is shuffled differently from epoch 0
    other = twice.data.loader(Augmented(), batch_size=4, shuffle=True, seed=12)
    assert not torch.equal(next(iter(other)), first[0])


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


def test_the_order_is_a_function_of_seed_and_epoch_and_each_rank_gets_its_share():
    one = EpochSampler(10, shuffle=True, seed=3, rank=0, world_size=1, drop_last=False)
    again = EpochSampler(10, shuffle=True, seed=3, rank=0, world_size=1, drop_last=False)
    assert one.order(0) == again.order(0) != one.order(1)
    assert sorted(one.order(1)) == list(range(10))
    assert EpochSampler(5, False, 3, 0, 1, False).order(7) == [0, 1, 2, 3, 4]
    shares = [EpochSampler(10, True, 3, r, 3, False).order(0) for r in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]  # padded by wrapping around, like DDP's
    assert set().union(*shares) == set(range(10))
    dropped = [EpochSampler(10, True, 3, r, 3, True).order(0) for r in range(3)]
    assert [len(s) for s in dropped] == [3, 3, 3]


def test_the_keys_name_the_epoch_and_resume_at_the_position():
    keys = EpochSampler(6, shuffle=True, seed=1, rank=0, world_size=1, drop_last=False)
    keys.set_epoch(2)
    full = list(keys)
    assert [epoch for epoch, _ in full] == [2] * 6 and [i for _, i in full] == keys.order(2)
    keys.start = 4
    assert list(keys) == full[4:] and len(keys) == 2


def test_a_user_batch_sampler_is_dealt_out_in_whole_batches_keyed_by_repeat():
    batches = [[0, 1], [1], [2, 3, 1]]
    keys = EpochSampler(4, False, 0, 0, 1, False, user=batches, user_batches=True)
    assert list(BatchKeys(keys)) == [
        [(0, 0), (0, 1)],
        [(2**32, 1)],  # index 1 again: a stream of its own, augmentations of its own
        [(0, 2), (0, 3), (2 * 2**32, 1)],
    ]
