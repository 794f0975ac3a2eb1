"""Deterministic, resumable data loading that gives the same batches for any number of workers.

`loader(dataset, ...)` wraps torch's DataLoader. The shuffle order is a function of (seed, epoch);
before each sample is fetched, Python's `random`, NumPy's global RNG and torch's global RNG are
seeded from (seed, epoch, sample index), in whichever process fetches it, so random augmentations
do not depend on which worker ran them. The position (epoch, batches served) is a state_dict, and
a resumed loader skips straight to it without fetching the batches before it.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from .seeding import mt_states, numpy_state_writer, python_state_writer, rng_changed, rng_restore, rng_snapshot, splitmix
from .seeds import derive_seed

__all__ = ["loader", "ResumableLoader"]

_PYTHON_STREAM, _NUMPY_STREAM = 0x7079, 0x6E70  # keep the Python and NumPy states of a sample apart


class _EpochSampler(Sampler):
    """Yields (epoch, index) pairs: this rank's share of the epoch's order, from a given position on."""

    def __init__(self, size: int, shuffle: bool, seed: int, rank: int, world_size: int, drop_last: bool):
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.epoch = 0
        self.start = 0  # samples of this rank's share already served

    def order(self, epoch: int) -> list[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "shuffle", epoch))
            indices = torch.randperm(self.size, generator=generator).tolist()
        else:
            indices = list(range(self.size))
        # Shard like DistributedSampler: pad by wrapping around (or drop the tail) so every rank
        # gets the same number of samples, then take every world_size-th from this rank's offset.
        if self.drop_last:
            per_rank = self.size // self.world_size
            indices = indices[: per_rank * self.world_size]
        else:
            per_rank = math.ceil(self.size / self.world_size)
            pad = per_rank * self.world_size - len(indices)
            indices += (indices * math.ceil(pad / max(len(indices), 1)))[:pad]
        return indices[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(itertools.repeat(self.epoch), self.order(self.epoch)[self.start:])

    def __len__(self) -> int:
        return len(self.order(self.epoch)) - self.start


class _SeededSamples(Dataset):
    """Fetches dataset[index] with every global RNG it draws from seeded from (seed, epoch, index).

    Seeding three RNGs costs ~6 us a sample, more than many datasets spend on the sample. So an
    RNG is seeded only once this process has seen the dataset draw from it: every batch is fetched
    with the RNGs known to be used seeded, and the others' states are compared before and after.
    When one has moved (the dataset drew from it), it joins the seeded ones and the batch is fetched
    again, from the same RNG states as the first time. The samples are then those every RNG seeded
    would give: an RNG a sample never draws from cannot change it. Each RNG costs a batch fetched
    twice, once per process, at most. A sample that draws from an RNG and then puts its state back
    (torch.random.fork_rng around unseeded draws) is not seen drawing; `seed_every_rng=True` on
    the loader seeds all three for every sample instead."""

    RNGS = ("python", "numpy", "torch")

    def __init__(self, dataset: Dataset, seed: int, seed_every_rng: bool = False):
        self.dataset, self.seed = dataset, seed
        self._epoch_keys: dict[int, int] = {}  # epoch -> derive_seed(seed, "sample", epoch)
        self.used = frozenset(self.RNGS if seed_every_rng else ())  # in this process

    def __len__(self) -> int:
        return len(self.dataset)

    def _fetch(self, keys: list[tuple[int, int]], used: frozenset) -> list[Any]:
        dataset = self.dataset
        if not used:
            return [dataset[index] for _, index in keys]
        import numpy as np

        # Seeds for the whole batch at once: sample i of epoch e gets SplitMix64 of i under
        # derive_seed(seed, "sample", e). A batch comes from one epoch (the sampler yields one).
        epochs = {epoch for epoch, _ in keys}
        if len(epochs) == 1:
            epoch_keys = self._epoch_key(epochs.pop())
        else:
            epoch_keys = np.asarray([self._epoch_key(epoch) for epoch, _ in keys], dtype=np.uint64)
        seeds = splitmix(epoch_keys, np.asarray([index for _, index in keys], dtype=np.uint64)).tolist()
        seeders = [_seeder(name, seeds) for name in self.RNGS if name in used]
        samples = []
        for row, ((_, index), sample_seed) in enumerate(zip(keys, seeds)):
            for seed_one in seeders:
                seed_one(row, sample_seed)
            samples.append(dataset[index])
        return samples

    def _epoch_key(self, epoch: int) -> int:
        key = self._epoch_keys.get(epoch)
        if key is None:
            key = self._epoch_keys[epoch] = derive_seed(self.seed, "sample", epoch)
        return key

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[Any]:
        """A whole batch (DataLoader calls this when it exists)."""
        before = rng_snapshot()
        used = self.used
        samples = self._fetch(keys, used)
        if len(used) < len(self.RNGS):
            drawn = rng_changed(before, rng_snapshot()) - used
            if drawn:
                self.used = used | drawn
                rng_restore(before)
                samples = self._fetch(keys, self.used)
        if get_worker_info() is None and self.used:
            # In the main process the training loop shares these RNGs: give back those seeded
            # (the others were not drawn from), so that num_workers=0 trains exactly like num_workers=4.
            rng_restore(before, only=self.used)
        return samples

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.__getitems__([key])[0]


class ResumableLoader:
    """A DataLoader whose batches depend only on (seed, epoch, position), with state_dict/load_state_dict.

    Iterating starts the current epoch (or continues it after `load_state_dict`); finishing an
    epoch moves to the next. `set_epoch(e)` chooses an epoch explicitly.
    """

    def __init__(self, dataset: Dataset, *, batch_size: int = 1, shuffle: bool = False, seed: int | None = None,
                 rank: int = 0, world_size: int = 1, drop_last: bool = False, seed_every_rng: bool = False,
                 **dataloader_kwargs: Any):
        if seed is None:
            seed = _default_seed()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), not rank={rank}, world_size={world_size}")
        for forbidden in ("sampler", "batch_sampler", "generator", "worker_init_fn"):
            if dataloader_kwargs.get(forbidden) is not None:
                raise ValueError(f"twice.data.loader sets {forbidden} itself; remove it")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.sampler = _EpochSampler(len(dataset), shuffle, seed, rank, world_size, drop_last)
        # One for the loader's life: what it learns about the RNGs the dataset draws from (in the
        # main process; each worker learns again in its own copy) is kept across epochs.
        self._samples = _SeededSamples(dataset, seed, seed_every_rng)
        self._kwargs = dataloader_kwargs
        self._drop_last_batch = drop_last
        self.batches_served = 0

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch, self.sampler.start, self.batches_served = epoch, 0, 0

    def __len__(self) -> int:
        samples = len(self.sampler.order(self.sampler.epoch))
        return samples // self.batch_size if self._drop_last_batch else math.ceil(samples / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.start = self.batches_served * self.batch_size
        # A generator of our own: DataLoader otherwise draws its workers' base seed from the global
        # torch RNG each epoch, so a resumed run (one iterator fewer) would drift from the original.
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "workers", self.sampler.epoch))
        inner = DataLoader(self._samples, batch_size=self.batch_size, sampler=self.sampler,
                           drop_last=self._drop_last_batch, generator=generator, **self._kwargs)
        for batch in inner:
            self.batches_served += 1
            yield batch
        self.set_epoch(self.sampler.epoch + 1)

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "batches_served": self.batches_served, "seed": self.seed,
                "batch_size": self.batch_size, "rank": self.sampler.rank, "world_size": self.sampler.world_size}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "batch_size", "world_size", "rank"):
            if state[key] != getattr(self, key, None) and state[key] != getattr(self.sampler, key, None):
                raise ValueError(f"loader {key} differs from the checkpoint's ({getattr(self, key, getattr(self.sampler, key, None))} "
                                 f"vs {state[key]}); resume with the same loader settings")
        self.sampler.epoch = state["epoch"]
        self.batches_served = state["batches_served"]


def _seeder(name: str, seeds: list[int]):
    """seed_one(row, seed), putting one global RNG in the state for sample `row` of a batch.

    Python's and NumPy's MT19937 states are built for the whole batch and copied in by address
    (seeding through random.seed costs ~4 us a sample, and the first draw after it regenerates the
    block); where their memory layout was not confirmed they are seeded through random.seed /
    np.random.seed. torch's is seeded with manual_seed (in C, ~1 us)."""
    if name == "torch":
        generator = torch.default_generator
        # default_generator.manual_seed: torch.manual_seed also visits every accelerator (~100x slower).
        # (A state built in NumPy and set with set_state costs as much, measured in the loader.)
        return lambda row, seed: generator.manual_seed(seed)
    if name == "python":
        put, stream, position_first = python_state_writer(), _PYTHON_STREAM, True
        if put is None:
            return lambda row, seed: random.seed(seed)
    else:
        put, stream, position_first = numpy_state_writer(), _NUMPY_STREAM, False
        if put is None:
            numpy = sys.modules["numpy"]
            return lambda row, seed: numpy.random.seed(seed & 0xFFFFFFFF)
    rows = mt_states(seeds, stream, position_first=position_first)
    start, step = rows.ctypes.data, rows.strides[0]
    return lambda row, seed, rows=rows: put(start + row * step)  # rows: the block stays alive


def _default_seed() -> int:
    import os

    root = os.environ.get("TWICE_SEED")
    return derive_seed(int(root) if root is not None else 0, "data")


def loader(dataset: Dataset, *, batch_size: int = 1, shuffle: bool = False, seed: int | None = None, rank: int = 0,
           world_size: int = 1, drop_last: bool = False, seed_every_rng: bool = False,
           **dataloader_kwargs: Any) -> ResumableLoader:
    """A deterministic, resumable DataLoader (see ResumableLoader); other keywords go to torch's DataLoader.

    The seed defaults to derive_seed(root, "data"), root being `twice run`'s seed (0 outside it).
    Only the RNGs the dataset is seen drawing from are seeded per sample (see _SeededSamples);
    `seed_every_rng=True` seeds Python's, NumPy's and torch's for every sample regardless.

    >>> data = twice.data.loader(dataset, batch_size=64, shuffle=True, num_workers=4)   # doctest: +SKIP
    """
    return ResumableLoader(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, rank=rank,
                           world_size=world_size, drop_last=drop_last, seed_every_rng=seed_every_rng, **dataloader_kwargs)
