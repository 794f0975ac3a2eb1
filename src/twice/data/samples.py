"""Fetching samples with every global RNG they draw from seeded from (seed, epoch, index).

What a sample draws from Python's `random`, NumPy's global RNG or torch's then depends on the
sample alone, not on which worker fetched it or what it fetched before.
"""

from __future__ import annotations

import operator
from typing import Any

from torch.utils.data import Dataset, get_worker_info

from twice.core.seeds import derive_seed
from twice.rng.layouts import MT_WORDS
from twice.rng.sample import START_WORDS, seeder
from twice.rng.sample import prepare as prepare_states
from twice.rng.seeding import seed_cpu_rngs
from twice.rng.snapshot import rng_changed, rng_restore, rng_snapshot

# The per-sample loop in C where it was built at install (see setup.py), else None: the Python loop
# (tests set None to hold the two together).
try:
    from twice import _native as native
except ImportError:
    native = None

__all__ = ["SeededSamples", "Collated", "collated"]

_second = operator.itemgetter(1)


class SeededSamples(Dataset):
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
        if native is not None and all(one.in_place for one in seeders):
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
            # Seeder.fits written out: read past the fresh words, or regenerated the block (new last
            # words)
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
        samples, needed = native.fetch(
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
            # (the others were not drawn from), so that num_workers=0 trains exactly like
            # num_workers=4.
            rng_restore(before, only=self.used)
        if self.collate is not None:
            return Collated(self._collate(keys, samples))
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


class Collated:
    """A batch collated inside __getitems__ (seeded there), passed through DataLoader's collate
    step."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any):
        self.batch = batch


def collated(batch: Collated) -> Any:
    """DataLoader's collate step for a batch already collated (and seeded) in __getitems__."""
    return batch.batch


def _needed(one, words: int) -> int:
    """Fresh words a sample that did not fit needed: its position, or all of them if it
    regenerated the block."""
    position = one.position()
    return position if position > words else MT_WORDS
