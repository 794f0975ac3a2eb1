"""The loader's sampler: an order that is a function of (seed, epoch) only, the same for any worker
count.

Each item is (epoch, index): the sample's key, from which its per-sample RNG states are made. A
user's own sampler or batch sampler is drawn from under a seed of its own, so that its order too
depends only on (seed, epoch).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from twice.core.errors import UsageError
from twice.core.seeds import derive_seed
from twice.rng.seeding import seed_cpu_rngs
from twice.rng.snapshot import rng_restore, rng_snapshot

__all__ = ["EpochSampler", "BatchKeys"]

_ABSENT = object()


class EpochSampler(Sampler):
    """Yields (stream, index) pairs: this rank's share of the epoch's order, from a given position
    on.

    The stream names the per-sample RNG states of the sample (see SeededSamples): the epoch, or
    for the k-th repeat of an index within an epoch of a user's sampler (one drawing with
    replacement) epoch + k * 2**32, so that repeats get augmentations of their own."""

    def __init__(
        self,
        size: int,
        shuffle: bool,
        seed: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        user: Any = None,
        user_batches: bool = False,
    ):
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.user = (
            user  # a sampler of the user's (WeightedRandomSampler, a subset), drawn once per epoch
        )
        # `user` is a batch sampler (bucketing by length): it yields lists of indices
        self.user_batches = user_batches
        # (epoch, indices, streams, batch sizes or None) of the last draw
        self._drawn: tuple[int, list[int], list[int], list[int] | None] | None = None
        self.epoch = 0
        self.start = 0  # samples of this rank's share already served (batches, for a batch sampler)

    def set_epoch(self, epoch: int) -> None:
        """Serve `epoch` next (DistributedSampler's interface, which trainers call as each epoch
        starts; the loader holding this sampler settles the position at its next pass)."""
        self.epoch = int(epoch)

    def order(self, epoch: int) -> list[int]:
        """The indices of `epoch` in the order they are served (this rank's share)."""
        if self.user is not None:
            indices = list(self._draw(epoch)[0])
        elif self.shuffle:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "shuffle", epoch))
            indices = torch.randperm(self.size, generator=generator).tolist()
        else:
            indices = list(range(self.size))
        return self._share(indices)

    def _share(self, items: list) -> list:
        """This rank's share, like DistributedSampler: pad by wrapping around (or drop the tail) so
        every rank gets the same number of samples, then every world_size-th from this rank's
        offset."""
        if self.world_size == 1:
            return items
        if self.drop_last:
            per_rank = len(items) // self.world_size
            items = items[: per_rank * self.world_size]
        else:
            per_rank = math.ceil(len(items) / self.world_size)
            pad = per_rank * self.world_size - len(items)
            items = items + (items * math.ceil(pad / max(len(items), 1)))[:pad]
        return items[self.rank :: self.world_size]

    def batches(self, epoch: int) -> list[list[tuple[int, int]]]:
        """A user's batch sampler's batches for `epoch`, as (stream, index) keys: this rank's share
        of them, whole batches dealt out like samples (padded by wrapping around)."""
        indices, streams, sizes = self._draw(epoch)
        keys, out, at = list(zip(streams, indices)), [], 0
        for size in sizes or ():
            out.append(keys[at : at + size])
            at += size
        return self._share(out)

    def _draw(self, epoch: int) -> tuple[list[int], list[int], list[int] | None]:
        """The user's sampler's indices for `epoch`, their streams, and for a batch sampler the
        sizes of its batches (the indices being theirs in a row). Its randomness is made a
        function of (seed, epoch): its `generator`, if it has one, and the global RNGs (for one that
        draws from them) are seeded for the draw, and the global RNGs given back after it; one with
        `set_epoch` (DistributedSampler) is told the epoch."""
        if self._drawn is not None and self._drawn[0] == epoch:
            return self._drawn[1], self._drawn[2], self._drawn[3]
        sampler, seed = self.user, derive_seed(self.seed, "sampler", epoch)
        try:
            count = len(sampler)
        except TypeError:
            raise UsageError(
                f"the {type(sampler).__name__} given to twice.data.loader has no length, so an "
                f"epoch "
                "of it has no end and no position to resume at",
                "give the sampler a __len__ (the samples per epoch)",
            ) from None
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)
        own = getattr(sampler, "generator", _ABSENT)
        before = rng_snapshot()
        seed_cpu_rngs(seed)
        try:
            if own is not _ABSENT:  # RandomSampler, WeightedRandomSampler, SubsetRandomSampler
                sampler.generator = torch.Generator().manual_seed(seed)
            drawn = list(
                itertools.islice(sampler, count)
            )  # an endless sampler gives an epoch of its length
        finally:
            if own is not _ABSENT:
                sampler.generator = own
            rng_restore(before)
        sizes = None
        if self.user_batches:
            sizes = []
            for batch in drawn:
                if (
                    isinstance(batch, (str, bytes))
                    or not hasattr(batch, "__len__")
                    or isinstance(batch, torch.Tensor)
                    and batch.dim() == 0
                ):
                    raise UsageError(
                        f"the batch_sampler given to twice.data.loader yielded {batch!r}, not a "
                        f"batch of indices",
                        "pass a sampler of single indices as sampler= instead",
                    )
                sizes.append(len(batch))
            drawn = [item for batch in drawn for item in batch]
        what = "batch_sampler" if self.user_batches else "sampler"
        indices, streams, seen = [], [], {}
        for item in drawn:
            try:
                index = operator.index(
                    item.item() if isinstance(item, torch.Tensor) and item.numel() == 1 else item
                )
            except TypeError:
                raise UsageError(
                    f"the {what} given to twice.data.loader yielded {item!r}, not a sample index",
                    "pass a sampler of indices as sampler=, or one of lists of indices as "
                    "batch_sampler=",
                ) from None
            if not 0 <= index < self.size:
                raise UsageError(
                    f"the {what} given to twice.data.loader yielded index {index}, outside the "
                    f"dataset's {self.size} samples",
                    "give the sampler the dataset the loader reads",
                )
            repeat = seen.get(index, 0)
            seen[index] = repeat + 1
            indices.append(index)
            streams.append(epoch + (repeat << 32))
        self._drawn = (epoch, indices, streams, sizes)
        return indices, streams, sizes

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = self.order(self.epoch)[self.start :]
        if self.user is None:
            return zip(itertools.repeat(self.epoch), indices)
        return zip(self._share(self._draw(self.epoch)[1])[self.start :], indices)

    def __len__(self) -> int:
        return len(self.order(self.epoch)) - self.start


class BatchKeys(Sampler):
    """DataLoader's batch_sampler under a user's batch sampler: this rank's batches of the epoch as
    lists of (stream, index) keys, from the position (in batches) on."""

    def __init__(self, sampler: EpochSampler):
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        return iter(self.sampler.batches(self.sampler.epoch)[self.sampler.start :])

    def __len__(self) -> int:
        return len(self.sampler.batches(self.sampler.epoch)) - self.sampler.start
