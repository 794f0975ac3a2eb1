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
import operator
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    get_worker_info,
)

from twice.core.errors import UsageError
from twice.core.protocol import ChildSettings
from twice.core.seeds import derive_seed
from twice.rng.layouts import MT_WORDS
from twice.rng.sample import START_WORDS, seeder
from twice.rng.sample import prepare as prepare_states
from twice.rng.seeding import seed_cpu_rngs
from twice.rng.snapshot import rng_changed, rng_restore, rng_snapshot

try:  # the per-sample loop in C, where it was built at install (see setup.py); else the Python loop
    from twice import _native
except ImportError:
    _native = None

__all__ = ["loader", "ResumableLoader"]

_second = operator.itemgetter(1)


class _EpochSampler(Sampler):
    """Yields (stream, index) pairs: this rank's share of the epoch's order, from a given position on.

    The stream names the per-sample RNG states of the sample (see _SeededSamples): the epoch, or
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
        self.user_batches = user_batches  # `user` is a batch sampler (bucketing by length): it yields lists of indices
        # (epoch, indices, streams, batch sizes or None) of the last draw
        self._drawn: tuple[int, list[int], list[int], list[int] | None] | None = None
        self.epoch = 0
        self.start = 0  # samples of this rank's share already served (batches, for a batch sampler)

    def order(self, epoch: int) -> list[int]:
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
        every rank gets the same number of samples, then every world_size-th from this rank's offset."""
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
                f"the {type(sampler).__name__} given to twice.data.loader has no length, so an epoch "
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
                        f"the batch_sampler given to twice.data.loader yielded {batch!r}, not a batch of indices",
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
                    "pass a sampler of indices as sampler=, or one of lists of indices as batch_sampler=",
                ) from None
            if not 0 <= index < self.size:
                raise UsageError(
                    f"the {what} given to twice.data.loader yielded index {index}, outside the dataset's {self.size} samples",
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


class _BatchKeys(Sampler):
    """DataLoader's batch_sampler under a user's batch sampler: this rank's batches of the epoch as
    lists of (stream, index) keys, from the position (in batches) on."""

    def __init__(self, sampler: _EpochSampler):
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        return iter(self.sampler.batches(self.sampler.epoch)[self.sampler.start :])

    def __len__(self) -> int:
        return len(self.sampler.batches(self.sampler.epoch)) - self.sampler.start


_ABSENT = object()


class _SeededSamples(Dataset):
    """Fetches dataset[index] with every global RNG it draws from seeded from (seed, epoch, index).

    A sample's state for each RNG comes from sample_rng (position 0 of a state made from (epoch
    key, index), copied in place; the batch is fetched again with more fresh words when a sample
    reads past them). Even so, putting three RNGs in place and checking them costs more than many
    datasets spend on a sample. So an RNG is seeded only once this process has seen the dataset
    draw from it: every batch is fetched with the RNGs known to be used seeded, and the others'
    states are compared before and after.
    When one has moved (the dataset drew from it), it joins the seeded ones and the batch is fetched
    again, from the same RNG states as the first time. The samples are then those every RNG seeded
    would give: an RNG a sample never draws from cannot change it. Each RNG costs a batch fetched
    twice, once per process, at most. A sample that draws from an RNG and then puts its state back
    (torch.random.fork_rng around unseeded draws) is not seen drawing; `seed_every_rng=True` on
    the loader seeds all three for every sample instead."""

    RNGS = ("python", "numpy", "torch")

    def __init__(
        self, dataset: Dataset, seed: int, seed_every_rng: bool = False, collate: Any = None
    ):
        self.dataset, self.seed = dataset, seed
        self.collate = collate  # the user's collate_fn, run here per batch (see _collate)
        self.collate_draws = False  # seen drawing from a global RNG: from then on seeded per batch
        self.mixed_streams = (
            False  # True under a user's sampler: a batch's samples can be of several streams
        )
        self._epoch_keys: dict[int, int] = {}  # epoch -> derive_seed(seed, "sample", epoch)
        self.used = frozenset(self.RNGS if seed_every_rng else ())  # in this process
        self.words: dict[
            str, int
        ] = {}  # RNG -> fresh words made per sample (START_WORDS until more were read)

    def __len__(self) -> int:
        return len(self.dataset)

    def _fetch(
        self, keys: list[tuple[int, int]], used: frozenset
    ) -> tuple[list[Any], dict[str, int]]:
        """The samples, each fetched with the RNGs in `used` in its own state; and, per RNG, how
        many fresh words some sample needed beyond those made (empty when every sample fitted)."""
        dataset = self.dataset
        if not used:
            return [dataset[index] for _, index in keys], {}
        import numpy as np

        # A batch from the loader's own sampler comes from one epoch (the sampler yields one per
        # pass, so its first and last keys tell): one key for all its samples. A user's sampler
        # can mix streams within a batch (repeats of an index).
        if keys[0][0] == keys[-1][0] and not self.mixed_streams:
            key = self._epoch_key(keys[0][0])
        else:
            key = np.asarray([self._epoch_key(e) for e, _ in keys], dtype=np.uint64)
        seeders = [seeder(name) for name in self.RNGS if name in used]
        counts = [(one, self.words.get(one.name, START_WORDS)) for one in seeders]
        if _native is not None and all(one.in_place for one in seeders):
            return self._fetch_compiled(keys, key, counts)
        indices = np.fromiter(map(_second, keys), np.uint64, len(keys))
        prepare_states(
            counts, key, indices, len(dataset)
        )  # the RNGs' states for the batch in one computation
        writes, constant, calls, checks = [], [], [], []
        for one, words in counts:
            if not one.in_place:
                calls.append(one.put)
                continue
            writes.append((one.target, one.rows))
            constant.extend(one.extra)
            if one.reset is not None:
                calls.append(one.reset)
            if words < MT_WORDS:
                checks.append(one.check + (words, one))
        if (
            len(writes) == 1 and len(constant) == 1 and not calls
        ):  # the usual case, torch's RNG alone: inlined
            return self._fetch_one(keys, writes[0], constant[0], checks[0] if checks else None)
        samples: list[Any] = []
        append, over = samples.append, {}
        for row, (_, index) in enumerate(keys):
            for target, rows in writes:
                target[:] = rows[row]
            for view, data in constant:
                view[:] = data
            for call in calls:
                call(row)
            append(dataset[index])
            # Seeder.fits written out: read past the fresh words, or regenerated the block (new last words)
            for position, tail, expected, words, one in checks:
                if position.value > words or tail.value != expected:
                    over[one.name] = max(over.get(one.name, 0), _needed(one, words))
        return samples, over

    def _fetch_compiled(self, keys: list[tuple[int, int]], key: Any, counts: list[tuple[Any, int]]):
        """`_fetch` in C (twice._native): each sample's states made and put in place, the
        sample fetched and checked, with no interpreter step per RNG and sample (with three RNGs,
        that was most of what seeding cost a cheap sample). The same states as `prepare` makes."""
        specs = tuple(one.compiled_spec(words) for one, words in counts)
        cleared = tuple(pair for one, _ in counts for pair in one.cleared)
        stream_keys = key if isinstance(key, int) else key.tolist()
        samples, needed = _native.fetch(
            self.dataset, keys if type(keys) is list else list(keys), stream_keys, specs, cleared
        )
        return samples, {one.name: count for (one, _), count in zip(counts, needed) if count}

    def _fetch_one(
        self, keys: list[tuple[int, int]], write: tuple, constant: tuple, check: tuple | None
    ):
        """`_fetch` for one RNG in place with one constant write (torch's): per sample two memcpys
        and, while not all words are fresh, two integer reads; no Python call of ours."""
        dataset, (target, rows), (view, data) = self.dataset, write, constant
        samples: list[Any] = []
        append, over = samples.append, {}
        checking = check is not None
        position, tail, expected, words, one = check if checking else (None,) * 5
        for image, (_, index) in zip(rows, keys):
            target[:] = image
            view[:] = data
            append(dataset[index])
            if checking and (position.value > words or tail.value != expected):
                over[one.name] = max(over.get(one.name, 0), _needed(one, words))
        return samples, over

    def _epoch_key(self, epoch: int) -> int:
        key = self._epoch_keys.get(epoch)
        if key is None:
            key = self._epoch_keys[epoch] = derive_seed(self.seed, "sample", epoch)
        return key

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[Any]:
        """A whole batch (DataLoader calls this when it exists)."""
        before = rng_snapshot()
        while True:
            used = self.used
            try:
                samples, over = self._fetch(keys, used)
            except BaseException:
                # A sample that raised (a loop that skips bad samples catches it): the states
                # put in for the samples must not stay in the training loop's RNGs.
                if get_worker_info() is None:
                    rng_restore(before)
                raise
            drawn = (
                rng_changed(before, rng_snapshot()) - used if len(used) < len(self.RNGS) else set()
            )
            if not drawn and not over:
                break
            # Seen drawing from an RNG not seeded yet, or reading beyond its fresh words: fetch
            # the batch again, from the same states, with that RNG seeded or more words made.
            self.used = used | drawn
            for name, needed in over.items():
                words = self.words.get(name, START_WORDS)
                self.words[name] = min(MT_WORDS, max(2 * words, 1 << (needed - 1).bit_length()))
            rng_restore(before)
        if get_worker_info() is None and self.used:
            # In the main process the training loop shares these RNGs: give back those seeded
            # (the others were not drawn from), so that num_workers=0 trains exactly like num_workers=4.
            rng_restore(before, only=self.used)
        if self.collate is not None:
            return _Collated(self._collate(keys, samples))
        return samples

    def _collate(self, keys: list[tuple[int, int]], samples: list[Any]) -> Any:
        """The user's collate_fn on a batch. One that draws random numbers (MixUp, CutMix) would
        otherwise draw from whatever state the fetching process is in: a worker's, or the training
        loop's with num_workers=0. So it is watched like the samples: once seen drawing from a
        global RNG, it runs with Python's, NumPy's and torch's CPU RNG seeded from (seed, the
        batch's samples), and the first batch it drew in is collated again that way. In the main
        process the RNGs are given back afterwards."""
        collate, main = self.collate, get_worker_info() is None
        before = rng_snapshot()
        if not self.collate_draws:
            batch = collate(samples)
            if not rng_changed(before, rng_snapshot()):
                return batch
            self.collate_draws = True
            rng_restore(before)
        import numpy as np

        seed_cpu_rngs(derive_seed(self.seed, "collate", np.asarray(keys, dtype=np.int64).tobytes()))
        try:
            return collate(samples)
        finally:
            if main:
                rng_restore(before)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.__getitems__([key])[0]


class ResumableLoader:
    """A DataLoader whose batches depend only on (seed, epoch, position), with state_dict/load_state_dict.

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
                f"twice.data.loader needs a map-style dataset (__len__ and __getitem__), not a {type(dataset).__name__}",
                "an iterable dataset's order and position are its own: seed it and save its position "
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
                "sampler and shuffle=True both choose the order; remove shuffle (the sampler's order is used, "
                "its randomness seeded per epoch)"
            )
        batch_sampler = dataloader_kwargs.pop("batch_sampler", None)
        if batch_sampler is not None:
            if user_sampler is not None or shuffle or drop_last or batch_size != 1:
                raise ValueError(
                    "batch_sampler chooses the batches: it excludes sampler, shuffle, drop_last and batch_size "
                    "(as in DataLoader); remove those"
                )
            user_sampler = batch_sampler
        if dataloader_kwargs.get("in_order", True) is False:
            raise ValueError(
                "in_order=False lets DataLoader hand out batches in the order its workers finish them, "
                "which differs from run to run; remove it (twice.data.loader keeps the sampler's order)"
            )
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.sampler = _EpochSampler(
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
        # A collate_fn of the user's runs inside the batch fetch, where it can be seeded (batch_size=None
        # has no collation of batches: DataLoader applies it to each sample as it is).
        collate = dataloader_kwargs.pop("collate_fn", None) if batch_size is not None else None
        self._samples = _SeededSamples(dataset, seed, seed_every_rng, collate)
        self._samples.mixed_streams = user_sampler is not None
        if collate is not None:
            dataloader_kwargs["collate_fn"] = _collated
        self._kwargs = dataloader_kwargs
        self._drop_last_batch = drop_last
        self.batches_served = 0
        self._persistent: DataLoader | None = (
            None  # with persistent_workers: one DataLoader, its workers kept
        )

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields (set_epoch or the checkpoint sets it)."""
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` next (its order is a function of the seed and the epoch only)."""
        self.sampler.epoch, self.sampler.start, self.batches_served = epoch, 0, 0

    def __len__(self) -> int:
        if self.sampler.user_batches:
            return len(self.sampler.batches(self.sampler.epoch))
        samples = len(self.sampler.order(self.sampler.epoch))
        per = self._per_item
        return samples // per if self._drop_last_batch else math.ceil(samples / per)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.start = self.batches_served * self._per_item
        for batch in self._inner():
            self.batches_served += 1
            yield batch
        self.set_epoch(self.sampler.epoch + 1)

    @property
    def _per_item(self) -> int:
        """Samples per item served: the batch size, or 1 with batch_size=None (DataLoader's unbatched
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
                batch_sampler=_BatchKeys(self.sampler),
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
        """Where the loader is: epoch and batches already yielded, for a checkpoint."""
        state = {
            "epoch": self.sampler.epoch,
            "batches_served": self.batches_served,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "rank": self.sampler.rank,
            "world_size": self.sampler.world_size,
            "samples": self.sampler.size,
        }
        if self.sampler.user is not None:
            state["sampler_order"] = self._order_digest(self.sampler.epoch)
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
                    f"loader {key} differs from the checkpoint's ({getattr(self, key, getattr(self.sampler, key, None))} "
                    f"vs {state[key]}); resume with the same loader settings"
                )
        # A dataset that grew or shrank since the checkpoint has another order, and the position
        # would point into it silently. (States saved before "samples" was recorded are taken as they are.)
        if "samples" in state and state["samples"] != self.sampler.size:
            raise ValueError(
                f"the dataset has {self.sampler.size} samples; the checkpoint's loader had {state['samples']}, "
                "so its position does not say where to continue; resume with the same dataset, "
                "or start the loader afresh (its set_epoch) to train on the new one"
            )
        if "sampler_order" in state and (
            self.sampler.user is None
            or state["sampler_order"] != self._order_digest(state["epoch"])
        ):
            raise ValueError(
                "the checkpoint's loader drew its order from a sampler, and this loader's "
                f"{'has no sampler' if self.sampler.user is None else 'sampler draws another order for the same epoch'}, "
                "so its position does not say where to continue; resume with the same sampler (its weights "
                "and length too), or start the loader afresh (its set_epoch)"
            )
        self.sampler.epoch = state["epoch"]
        self.batches_served = state["batches_served"]


class _Collated:
    """A batch collated inside __getitems__ (seeded there), passed through DataLoader's collate step."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any):
        self.batch = batch


def _collated(batch: _Collated) -> Any:
    return batch.batch


def _needed(one, words: int) -> int:
    """Fresh words a sample that did not fit needed: its position, or all of them if it regenerated the block."""
    position = one.position()
    return position if position > words else MT_WORDS


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
    """A deterministic, resumable DataLoader (see ResumableLoader); other keywords go to torch's DataLoader.

    The seed defaults to derive_seed(root, "data"), root being `twice run`'s seed (0 outside it).
    Only the RNGs the dataset is seen drawing from are seeded per sample (see _SeededSamples);
    `seed_every_rng=True` seeds Python's, NumPy's and torch's for every sample regardless.

    >>> data = twice.data.loader(dataset, batch_size=64, shuffle=True, num_workers=4)   # doctest: +SKIP
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
