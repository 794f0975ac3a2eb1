"""Deterministic, resumable data loading that gives the same batches for any number of workers.

`loader(dataset, ...)` wraps torch's DataLoader. The shuffle order is a function of (seed, epoch);
before each sample is fetched, Python's `random`, NumPy's global RNG and torch's global RNG are
seeded from (seed, epoch, sample index), in whichever process fetches it, so random augmentations
do not depend on which worker ran them. The position (epoch, batches served) is a state_dict, and
a resumed loader skips straight to it without fetching the batches before it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
)

from twice.core.errors import UsageError
from twice.core.protocol import ChildSettings
from twice.core.seeds import derive_seed
from twice.data.sampler import BatchKeys, EpochSampler
from twice.data.samples import SeededSamples, collated

__all__ = ["loader", "ResumableLoader"]


class ResumableLoader:
    """A DataLoader whose batches depend only on (seed, epoch, position), with
    state_dict/load_state_dict.

    Iterating starts the current epoch (or continues it after `load_state_dict`); finishing an
    epoch moves to the next. `set_epoch(e)` chooses an epoch explicitly.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        seed_every_rng: bool = False,
        **dataloader_kwargs: Any,
    ):
        if isinstance(dataset, IterableDataset) or not (
            hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
        ):
            raise UsageError(
                f"twice.data.loader needs a map-style dataset (__len__ and __getitem__), not a "
                f"{type(dataset).__name__}",
                "an iterable dataset's order and position are its own: seed it and save its "
                "position "
                "yourself, or give the loader a Dataset indexed by sample",
            )
        if seed is None:
            seed = _default_seed()
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank must be in [0, world_size), not rank={rank}, world_size={world_size}"
            )
        for forbidden in ("generator", "worker_init_fn"):
            if dataloader_kwargs.get(forbidden) is not None:
                raise ValueError(f"twice.data.loader sets {forbidden} itself; remove it")
        user_sampler = dataloader_kwargs.pop("sampler", None)
        if user_sampler is not None and shuffle:
            raise ValueError(
                "sampler and shuffle=True both choose the order; remove shuffle (the sampler's "
                "order is used, "
                "its randomness seeded per epoch)"
            )
        batch_sampler = dataloader_kwargs.pop("batch_sampler", None)
        if batch_sampler is not None:
            if user_sampler is not None or shuffle or drop_last or batch_size != 1:
                raise ValueError(
                    "batch_sampler chooses the batches: it excludes sampler, shuffle, drop_last "
                    "and batch_size "
                    "(as in DataLoader); remove those"
                )
            user_sampler = batch_sampler
        if dataloader_kwargs.get("in_order", True) is False:
            raise ValueError(
                "in_order=False lets DataLoader hand out batches in the order its workers finish "
                "them, "
                "which differs from run to run; remove it (twice.data.loader keeps the sampler's "
                "order)"
            )
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.sampler = EpochSampler(
            len(dataset),
            shuffle,
            seed,
            rank,
            world_size,
            drop_last,
            user_sampler,
            user_batches=batch_sampler is not None,
        )
        # One for the loader's life: what it learns about the RNGs the dataset draws from (in the
        # main process; each worker learns again in its own copy) is kept across epochs.
        # A collate_fn of the user's runs inside the batch fetch, where it can be seeded
        # (batch_size=None
        # has no collation of batches: DataLoader applies it to each sample as it is).
        collate = dataloader_kwargs.pop("collate_fn", None) if batch_size is not None else None
        self._samples = SeededSamples(dataset, seed, seed_every_rng, collate)
        self._samples.mixed_streams = user_sampler is not None
        if collate is not None:
            dataloader_kwargs["collate_fn"] = collated
        self._kwargs = dataloader_kwargs
        self._drop_last_batch = drop_last
        self.batches_served = 0
        self._served_epoch = 0  # the epoch batches_served counts in (see _position)
        self._persistent: DataLoader | None = (
            None  # with persistent_workers: one DataLoader, its workers kept
        )

    # DataLoader's attribute, which trainers read beside `sampler` (Lightning, to warn about
    # shuffled validation data): the batches are made inside, from `sampler`'s order.
    batch_sampler = None

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields (set_epoch or the checkpoint sets it)."""
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` next (its order is a function of the seed and the epoch only)."""
        self.sampler.epoch, self.sampler.start, self.batches_served = epoch, 0, 0
        self._served_epoch = epoch

    def _position(self) -> None:
        """Settle where the next pass starts. A trainer may have set the sampler's epoch
        (Lightning calls `loader.sampler.set_epoch(e)` as each epoch starts): that epoch, from its
        start, unless it is the one in progress (a resumed position is kept). A pass served to its
        end but never asked for one more batch (a loop that stops at len(loader), as Lightning
        does) is over: the next epoch starts."""
        if self.sampler.epoch != self._served_epoch:
            self.set_epoch(self.sampler.epoch)
        elif self.batches_served and self.batches_served >= len(self):
            self.set_epoch(self.sampler.epoch + 1)

    def __len__(self) -> int:
        if self.sampler.user_batches:
            return len(self.sampler.batches(self.sampler.epoch))
        samples = len(self.sampler.order(self.sampler.epoch))
        per = self._per_item
        return samples // per if self._drop_last_batch else math.ceil(samples / per)

    def __iter__(self) -> Iterator[Any]:
        self._position()
        epoch = self.sampler.epoch
        self.sampler.start = self.batches_served * self._per_item
        for batch in self._inner():
            self.batches_served += 1
            yield batch
        if self.sampler.epoch == self._served_epoch == epoch:  # (unless moved meanwhile)
            self.set_epoch(epoch + 1)

    @property
    def _per_item(self) -> int:
        """Samples per item served: the batch size, or 1 with batch_size=None (DataLoader's
        unbatched
        samples); under a user's batch sampler the position counts batches, so 1."""
        return 1 if self.batch_size is None or self.sampler.user_batches else self.batch_size

    def _inner(self) -> DataLoader:
        """The DataLoader of this pass: a new one each pass, or with persistent_workers one for the
        loader's life, whose workers DataLoader keeps; it reads the sampler's epoch and position
        afresh at each pass either way."""
        persistent = (
            bool(self._kwargs.get("persistent_workers")) and self._kwargs.get("num_workers", 0) > 0
        )
        if persistent and self._persistent is not None:
            return self._persistent
        # A generator of our own: DataLoader otherwise draws its workers' base seed from the global
        # torch RNG each epoch, so a resumed run (one iterator fewer) would drift from the original.
        # (The samples do not depend on it: every RNG they draw from is seeded per sample.)
        generator = torch.Generator().manual_seed(
            derive_seed(self.seed, "workers")
            if persistent
            else derive_seed(self.seed, "workers", self.sampler.epoch)
        )
        if self.sampler.user_batches:
            inner = DataLoader(
                self._samples,
                batch_sampler=BatchKeys(self.sampler),
                generator=generator,
                **self._kwargs,
            )
        else:
            inner = DataLoader(
                self._samples,
                batch_size=self.batch_size,
                sampler=self.sampler,
                drop_last=self._drop_last_batch,
                generator=generator,
                **self._kwargs,
            )
        if persistent:
            self._persistent = inner
        return inner

    def state_dict(self) -> dict:
        """Where the loader is: epoch and batches already yielded, for a checkpoint. An epoch
        served to its end is saved as the next epoch's start (the same position): a loop that
        stops and one that asks for the next batch save the same state."""
        epoch, served = self.sampler.epoch, self.batches_served
        if epoch != self._served_epoch:  # set_epoch on the sampler: that epoch's start
            served = 0
        if served and served >= len(self):
            epoch, served = epoch + 1, 0
        state = {
            "epoch": epoch,
            "batches_served": served,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "rank": self.sampler.rank,
            "world_size": self.sampler.world_size,
            "samples": self.sampler.size,
        }
        if self.sampler.user is not None:
            state["sampler_order"] = self._order_digest(epoch)
        return state

    def _order_digest(self, epoch: int) -> str:
        """Digest of a user's sampler's order for `epoch`: a resumed loader whose sampler draws
        another (its weights changed with the data) is refused rather than continued in it."""
        import numpy as np
        import xxhash

        indices, _, sizes = self.sampler._draw(epoch)
        hasher = xxhash.xxh3_64(np.asarray(indices, dtype=np.int64).tobytes())
        if sizes is not None:  # and where a batch sampler's batches begin
            hasher.update(np.asarray(sizes, dtype=np.int64).tobytes())
        return hasher.hexdigest()

    def load_state_dict(self, state: dict) -> None:
        """Continue from a state_dict: the next batch is the one after the last yielded."""
        missing = [
            key
            for key in ("epoch", "batches_served", "seed", "batch_size", "rank", "world_size")
            if key not in state
        ]
        if missing:
            raise ValueError(
                f"not a twice.data.loader state: it lacks {', '.join(missing)}; "
                "pass what this loader's state_dict() returned"
            )
        for key in ("seed", "batch_size", "world_size", "rank"):
            if state[key] != getattr(self, key, None) and state[key] != getattr(
                self.sampler, key, None
            ):
                raise ValueError(
                    f"loader {key} differs from the checkpoint's "
                    f"({getattr(self, key, getattr(self.sampler, key, None))} "
                    f"vs {state[key]}); resume with the same loader settings"
                )
        # A dataset that grew or shrank since the checkpoint has another order, and the position
        # would point into it silently. (States saved before "samples" was recorded are taken as
        # they are.)
        if "samples" in state and state["samples"] != self.sampler.size:
            raise ValueError(
                f"the dataset has {self.sampler.size} samples; the checkpoint's loader had "
                f"{state['samples']}, "
                "so its position does not say where to continue; resume with the same dataset, "
                "or start the loader afresh (its set_epoch) to train on the new one"
            )
        if "sampler_order" in state and (
            self.sampler.user is None
            or state["sampler_order"] != self._order_digest(state["epoch"])
        ):
            mine = (
                "has no sampler"
                if self.sampler.user is None
                else "sampler draws another order for the same epoch"
            )
            raise ValueError(
                f"the checkpoint's loader drew its order from a sampler, and this loader's {mine}, "
                "so its position does not say where to continue; resume with the same sampler "
                "(its weights and length too), or start the loader afresh (its set_epoch)"
            )
        self.sampler.epoch = self._served_epoch = state["epoch"]
        self.batches_served = state["batches_served"]


def _default_seed() -> int:
    import os

    root = ChildSettings.read(os.environ, "seed")
    return derive_seed(int(root) if root is not None else 0, "data")


def loader(
    dataset: Dataset,
    *,
    batch_size: int = 1,
    shuffle: bool = False,
    seed: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
    seed_every_rng: bool = False,
    **dataloader_kwargs: Any,
) -> ResumableLoader:
    """A deterministic, resumable DataLoader (see ResumableLoader); other keywords go to torch's
    DataLoader.

    The seed defaults to derive_seed(root, "data"), root being `twice run`'s seed (0 outside it).
    Only the RNGs the dataset is seen drawing from are seeded per sample (see SeededSamples);
    `seed_every_rng=True` seeds Python's, NumPy's and torch's for every sample regardless.

    >>> data = twice.data.loader(dataset, batch_size=64, shuffle=True)   # doctest: +SKIP
    """
    return ResumableLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        seed_every_rng=seed_every_rng,
        **dataloader_kwargs,
    )
