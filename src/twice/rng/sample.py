"""Per-sample RNG states for `twice.data.loader`: each global RNG a sample draws from is put, before
the sample, in a state made from (key, sample index) alone, the key being the loader's per-epoch
key.

The numbers come from one SplitMix64 sequence per key: sample i owns its counters i*1024 to
i*1024+1023; counter 0 is its seed (what torch.initial_seed() says inside the sample), and each
RNG takes 312 counters of the rest (two 32-bit words each, low half first) as the 624 words of an
MT19937 state at position 0, so that the next draws read those words directly. Where the RNG's
memory layout was confirmed (CPython's `random`, NumPy's legacy global RandomState, torch's CPU
generator; see layouts.py), the state is an image of that memory, built in NumPy for the whole
batch and copied in with one memcpy per sample.

Most samples draw a handful of numbers, and making 624 fresh words costs more than a cheap sample
(~0.6 us against a 5% budget of ~0.5 us). So only the first `words` words of each image are fresh,
and only they (with the position) are written per sample. After the sample, `fits(words)` reads the
RNG's position and its last two words (put back to the template's before each batch; regenerating
the block changes them): if the sample read only fresh words and regenerated no block, it drew
exactly what the complete state gives it. Otherwise the caller fetches the batch again with more
words, up to all 624, where the state is complete and any number of draws is exact. A sample's
numbers therefore depend on (key, index) alone, never on how many words a process made fresh.

Where a layout was not confirmed, the same states are set through the library's own API (slower,
the same numbers).
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from collections.abc import Callable

from twice.rng import layouts
from twice.rng.layouts import MT_WORDS, torch_state_bytes
from twice.rng.splitmix import splitmix_finish

__all__ = ["Seeder", "seeder", "START_WORDS", "SAMPLE_COUNTERS", "OFFSETS"]

START_WORDS = 16  # fresh words per sample until a sample is seen reading more
SAMPLE_COUNTERS = 1024  # SplitMix64 counters each sample owns
_PAIRS = MT_WORDS // 2  # SplitMix64 outputs per state: each gives two 32-bit words, low half first
OFFSETS = {
    "python": 1,
    "numpy": 1 + _PAIRS,
    "torch": 1 + 2 * _PAIRS,
}  # an RNG's first counter in a sample's block
_GOLDEN = 0x9E3779B97F4A7C15
_SAMPLE_STEP = (
    SAMPLE_COUNTERS * _GOLDEN % 2**64
)  # from one sample's first counter to the next's, times golden
_STEP = (
    None  # the same as a NumPy uint64 (set when the first Seeder is made: NumPy is loaded by then)
)


class Seeder:
    """Puts one global RNG in each sample's state: `prepare(key, indices, words)` once a batch, then
    per sample `put(row)` before it and `fits(words)` after it (False: it read beyond the fresh
    words).

    In place, put(row) is `target[:] = rows[row]` plus `(view, data)` writes in `extra` and the
    attributes in `cleared` set to None: the loader's loop does those itself, saving a Python call
    per sample."""

    def __init__(
        self,
        name: str,
        template: bytes,
        words_at: int,
        seed_at: int | None,
        target: int | None = None,
        position_at: int | None = None,
        extra: tuple = (),
        cleared: tuple = (),
    ):
        global _STEP
        np = sys.modules["numpy"]
        _STEP = np.uint64(_SAMPLE_STEP)
        self.name = name
        self.template = np.frombuffer(template, dtype=np.uint8)
        self.words_at, self.seed_at = words_at, seed_at
        # of the RNG's memory, where the layout was confirmed (the images are copied there)
        self.address = target
        self._memory = (
            None
            if target is None
            else memoryview((ctypes.c_char * len(template)).from_address(target)).cast("B")
        )
        # Per sample only the bytes up to the last fresh word are written: a sample that fits never
        # read the words after them, so they need not be fresh, or even known.
        # (address, bytes) also written per sample: position, cached normals; and as (memoryview,
        # bytes)
        self.extra_at = extra
        self.extra = tuple(
            (memoryview((ctypes.c_char * len(data)).from_address(at)).cast("B"), data)
            for at, data in extra
        )
        self.cleared = (
            cleared  # (object, attribute) pairs set to None per sample: Python's cached Gaussian
        )
        self.reset: Callable[[int], None] | None = (
            None  # the same as a call with the row (the Python loop's)
        )
        if cleared:

            def reset(row: int) -> None:
                for owner, attribute in cleared:
                    setattr(owner, attribute, None)

            self.reset = reset
        self.check = (
            None  # in place: (position, last two words, their template value), as ctypes integers
        )
        # (memoryview, bytes) written once a batch while words are not all fresh
        self._batch_extra: tuple = ()
        self._batch_extra_at: tuple = ()  # the same as (address, bytes)
        if target is not None:
            tail_at = words_at + 4 * (MT_WORDS - 2)
            tail = ctypes.c_uint64.from_address(target + tail_at)
            self.check = (
                ctypes.c_uint32.from_address(target + position_at),
                tail,
                struct.unpack_from("<Q", template, tail_at)[0],
            )
            # The template's last two words go back in place before each batch: regenerating the
            # block changes them all, which is how `fits` tells a sample that read 630 words from
            # one that read 6.
            self._batch_extra_at = ((target + tail_at, bytes(template[tail_at : tail_at + 8])),)
            self._batch_extra = tuple(
                (memoryview((ctypes.c_char * 8).from_address(at)).cast("B"), data)
                for at, data in self._batch_extra_at
            )
        # counters (times the golden ratio, wrapping) of this RNG's pairs, and of the seed first if
        # it has one
        offsets = ([0] if seed_at is not None else []) + list(
            range(OFFSETS[name], OFFSETS[name] + _PAIRS)
        )
        self._counters = np.asarray(offsets, dtype=np.uint64) * np.uint64(_GOLDEN)
        self._images = None
        self._specs: dict[int, tuple] = {}  # fresh words -> compiled_spec()
        self.target = None  # the memoryview a row is copied into (in place), sized like the rows
        self.rows: list = []  # per row of the last prepare(): its image as a memoryview

    def fits(self, words: int) -> bool:
        """After a sample: did it read only the first `words` words (and regenerate no block)?"""
        if self.check is None or words >= MT_WORDS:
            return True
        position, tail, expected = self.check
        return position.value <= words and tail.value == expected

    def position(self) -> int:
        """The generator's position in its state after the last sample (the words it has used)."""
        return 0 if self.check is None else self.check[0].value

    @property
    def in_place(self) -> bool:
        """Whether states are written into the generators' memory (else through their API)."""
        return self._memory is not None

    def prepare(self, key, indices, words: int) -> None:
        """Make the images of a batch's samples (`indices`: a NumPy uint64 array; `key`: the epoch's
        key, or an array of one per sample), each with its first `words` words fresh (all where the
        layout is not confirmed); `rows` holds them until the next call. See also `prepare`, which
        makes several RNGs' images with one computation."""
        prepare([(self, words)], key, indices)

    def _columns(self, words: int):
        """The counters (times golden) this RNG needs for `words` fresh words: its seed's, then
        its pairs'."""
        words = MT_WORDS if not self.in_place else min(MT_WORDS, words)
        return self._counters[: (words + 1) // 2 + (self.seed_at is not None)]

    def _fill(self, values, rows: int) -> None:
        """Write the finished SplitMix64 `values` of `_columns` into the images and make the row
        views.

        The images hold only what is written per sample (up to the last fresh word): 64 rows of a
        few dozen bytes stay in cache, where whole 2.5 kB states would not."""
        np = sys.modules["numpy"]
        start, seeded = self.words_at, self.seed_at is not None
        pairs = values.shape[1] - seeded
        fresh = min(MT_WORDS, 2 * pairs)
        width = start + 4 * fresh
        images = self._images
        if images is None or images.shape != (rows, width):
            images = self._images = np.tile(self.template[:width], (rows, 1))
            if self.in_place:
                flat = memoryview(images.reshape(-1))
                self.rows = [flat[row * width : (row + 1) * width] for row in range(rows)]
                self.target = self._memory[:width]
        if seeded:
            images[:, self.seed_at : self.seed_at + 8] = values[:, :1].view(np.uint8)
        images[:, start : start + 8 * pairs] = values[:, seeded:].view(np.uint8)[:, : 4 * fresh]
        if self.in_place and fresh < MT_WORDS:
            for view, data in self._batch_extra:
                view[:] = data

    def compiled_spec(self, words: int) -> tuple:
        """What twice._native needs to make and put this RNG's per-sample states itself, with
        `words` fresh words (in place only): the same bytes `_fill` and `put` write, and the
        check."""
        spec = self._specs.get(words)
        if spec is None:
            columns = self._columns(words)
            seeded = self.seed_at is not None
            fresh = min(MT_WORDS, 2 * (len(columns) - seeded))
            check = None
            if words < MT_WORDS:  # as SeededSamples._fetch checks
                position, tail, expected = self.check
                check = (ctypes.addressof(position), ctypes.addressof(tail), expected, words)
            batch = self._batch_extra_at if fresh < MT_WORDS else ()  # as _fill writes them
            spec = self._specs[words] = (
                self.address,
                bytes(self.template[: self.words_at]),
                self.seed_at if seeded else -1,
                self.words_at,
                columns.tobytes(),
                4 * fresh,
                self.extra_at,
                batch,
                check,
            )
        return spec

    def put(self, row: int) -> None:
        """Put the RNG in the state of a row of the last prepare()."""
        if not self.in_place:
            return self._put_api(row)
        self.target[:] = self.rows[row]
        for view, data in self.extra:
            view[:] = data
        if self.reset is not None:
            self.reset(row)

    def words_of(self, row: int) -> list[int]:
        """The 624 words of a row's state (as prepared with all words fresh)."""
        start = self.words_at
        return list(
            struct.unpack_from(
                f"<{MT_WORDS}I", self._images[row, start : start + 4 * MT_WORDS].tobytes()
            )
        )

    def _put_api(self, row: int) -> None:
        words = self.words_of(row)
        if self.name == "python":
            random.setstate((3, tuple(words) + (0,), None))
        elif self.name == "numpy":
            np = sys.modules["numpy"]
            np.random.set_state(("MT19937", np.asarray(words, dtype=np.uint32), 0, 0, 0.0))
        else:
            torch = sys.modules["torch"]
            seed = int(
                self._images[row, self.seed_at : self.seed_at + 8].view(
                    sys.modules["numpy"].uint64
                )[0]
            )
            state = torch.frombuffer(bytearray(torch_state_bytes(seed, words)), dtype=torch.uint8)
            torch.default_generator.set_state(state)


TABLE_VALUES = 1 << 20  # an epoch's values are made at once where they number at most this (8 MB)
TABLES_KEPT = 4  # epoch tables kept per process, the oldest dropped first


def prepare(seeders: list[tuple[Seeder, int]], key, indices, size: int | None = None) -> None:
    """Make the images of a batch for several (Seeder, fresh words) at once: numpy's per-call cost,
    not the arithmetic, is what a batch of 64 pays for, so their SplitMix64 values are one array.
    Given `size` (the dataset's length), where the values of every sample of the epoch number at
    most TABLE_VALUES they are made at its first batch (one computation, well under 1 us a sample)
    and each batch takes its rows from them."""
    np = sys.modules["numpy"]
    rows = len(indices)
    which = tuple(seeders)
    if (
        size is not None
        and isinstance(key, int)
        and size * sum(len(one._columns(words)) for one, words in seeders) <= TABLE_VALUES
    ):
        table = TABLES.get((which, key, size))
        if table is None:
            if (
                len(TABLES) >= TABLES_KEPT
            ):  # loaders used in turn (zipped, or train and validation) keep theirs
                del TABLES[next(iter(TABLES))]
            every = sample_values(which, key, np.arange(size, dtype=np.uint64), keep=False)
            table = TABLES[(which, key, size)] = (key, every, _spans(seeders), {})
        taken = table[3].get(rows)
        if taken is None:
            taken = table[3][rows] = np.empty((rows, table[1].shape[1]), np.uint64)
        np.take(table[1], indices.astype(np.intp), axis=0, out=taken)
        _fill_all(table[2], taken, rows)
        return
    _fill_all(_spans(seeders), sample_values(which, key, indices), rows)


def sample_values(which: tuple, key, indices, keep: bool = True):
    """The finished SplitMix64 values of a batch's samples for (Seeder, words) pairs `which`; with
    `keep`, in a buffer reused by the next call with as many samples (numpy's per-call cost, not
    the arithmetic, is what a batch pays for)."""
    np = sys.modules["numpy"]
    rows = len(indices)
    plan = PLANS.get((which, rows)) if keep else None
    if plan is None:
        counters = np.concatenate([one._columns(words) for one, words in which])
        plan = (counters, np.empty(rows, np.uint64), np.empty((rows, len(counters)), np.uint64), {})
        if keep:
            if len(PLANS) > 8:
                PLANS.clear()  # batch sizes or fresh words changed: keep a few
            PLANS[(which, rows)] = plan
    counters, firsts, values, keyed = plan
    np.multiply(indices, _STEP, out=firsts)
    if isinstance(key, int):
        shifted = keyed.get(key)
        if shifted is None:
            keyed.clear()
            shifted = keyed[key] = counters + np.uint64(key)
        np.add(firsts[:, None], shifted[None, :], out=values)
    else:
        firsts += key
        np.add(firsts[:, None], counters[None, :], out=values)
    return splitmix_finish(values, keep)


def _spans(seeders: list[tuple[Seeder, int]]) -> list[tuple[int, Seeder]]:
    return [(len(one._columns(words)), one) for one, words in seeders]


def _fill_all(spans: list[tuple[int, Seeder]], values, rows: int) -> None:
    if len(spans) == 1:
        spans[0][1]._fill(values, rows)
        return
    column = 0
    for width, one in spans:
        one._fill(values[:, column : column + width], rows)
        column += width


# ((Seeder, words) pairs, rows) -> (counters, buffers, {key: counters + key}) for sample_values
PLANS: dict = {}
# ((Seeder, words) pairs, epoch key, samples) -> (key, every sample's values, column spans, {rows:
# buffer})
TABLES: dict = {}


SEEDERS: dict = {}  # (name, ids of the RNG objects) -> Seeder


def seeder(name: str) -> Seeder:
    """The Seeder of one global RNG of this process ("python", "numpy" or "torch")."""
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    key = (
        name,
        id(random._inst),
        id(np),
        id(torch.default_generator) if torch is not None else None,
    )
    found = SEEDERS.get(key)
    if found is None:
        found = SEEDERS[key] = _make(name)
    return found


def _make(name: str) -> Seeder:
    template_words = struct.pack(
        f"<{MT_WORDS}I", *layouts._mt_init(5489)
    )  # any valid state: MT's default
    if name == "python":
        template = (
            struct.pack("<i", 0) + template_words
        )  # CPython's {int index; uint32_t state[624]}
        if layouts._python_state_bytes() is None:
            return Seeder(name, template, 4, None)
        inst = random._inst
        return Seeder(
            name,
            template,
            4,
            None,
            id(inst) + layouts.CONFIRMED.python_state_offset[0],
            0,
            cleared=((inst, "gauss_next"),),
        )
    if name == "numpy":
        template = template_words + struct.pack("<i", 0)  # NumPy's {uint32_t key[624]; int pos}
        if layouts._numpy_state_bytes() is None or layouts._numpy_gauss_address() is None:
            return Seeder(name, template, 0, None)
        generator = sys.modules["numpy"].random.mtrand._rand._bit_generator
        target, gauss_at = (
            layouts.CONFIRMED.numpy_state_address[id(generator)],
            layouts._numpy_gauss_address(),
        )
        # the position (after the words) and the cached Gaussian
        return Seeder(
            name,
            template,
            0,
            None,
            target,
            4 * MT_WORDS,
            extra=((target + 4 * MT_WORDS, bytes(4)), (gauss_at, bytes(16))),
        )
    layout, target = layouts.torch_layout(), layouts.torch_state_address()
    if layout is None or target is None:
        # The image layout of get_state() bytes is not used by the API path: only words and seed are
        # read.
        template = bytes(8) + struct.pack("<iiI", MT_WORDS, 1, 0) + template_words
        return Seeder(name, template, 20, 0)
    words_end = (
        layout.words + 4 * MT_WORDS
    )  # after the words: the cached normals, cleared per sample
    # The position read is `next` (the index of the next word); its `left` is written with it per
    # sample.
    return Seeder(
        name,
        layout.template,
        layout.words,
        0,
        target,
        layout.next,
        extra=((target + words_end, bytes(layout.template[words_end:])),),
    )
