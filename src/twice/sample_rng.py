"""Per-sample RNG states for `twice.data.loader`: each global RNG a sample draws from is put, before
the sample, in a state made from (key, sample index) alone, the key being the loader's per-epoch key.

The numbers come from one SplitMix64 sequence per key: sample i owns its counters i*1024 to
i*1024+1023; counter 0 is its seed (what torch.initial_seed() says inside the sample), and each
RNG takes 312 counters of the rest (two 32-bit words each, low half first) as the 624 words of an
MT19937 state at position 0, so that the next draws read those words directly. Where the RNG's
memory layout was confirmed (CPython's `random`, NumPy's legacy global RandomState, torch's CPU
generator; see seeding.py), the state is an image of that memory, built in NumPy for the whole
batch and copied in with one memcpy per sample.

Most samples draw a handful of numbers, and making 624 fresh words costs more than a cheap sample
(~0.6 us against a 5% budget of ~0.5 us). So only the first `words` words of each image are fresh;
after the sample, `fits(words)` reads the RNG's position: if the sample read only fresh words (and
regenerated no block), it drew exactly what the complete state gives it. Otherwise the caller
fetches the batch again with more words, up to all 624, where the state is complete and any number
of draws is exact. A sample's numbers therefore depend on (key, index) alone, never on how many
words a process happened to make fresh.

Where a layout was not confirmed, the same states are set through the library's own API (slower,
the same numbers).
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from typing import Callable

from . import seeding
from .seeding import MT_WORDS, scratch, splitmix_finish, torch_state_bytes

__all__ = ["Seeder", "seeder", "START_WORDS", "SAMPLE_COUNTERS", "OFFSETS"]

START_WORDS = 16  # fresh words per sample until a sample is seen reading more
SAMPLE_COUNTERS = 1024  # SplitMix64 counters each sample owns
_PAIRS = MT_WORDS // 2  # SplitMix64 outputs per state: each gives two 32-bit words, low half first
OFFSETS = {"python": 1, "numpy": 1 + _PAIRS, "torch": 1 + 2 * _PAIRS}  # an RNG's first counter in a sample's block
_GOLDEN = 0x9E3779B97F4A7C15
_SAMPLE_STEP = SAMPLE_COUNTERS * _GOLDEN % 2**64  # from one sample's first counter to the next's, times golden


class Seeder:
    """Puts one global RNG in each sample's state: `prepare(key, indices, words)` once a batch, then
    per sample `put(row)` before it and `fits(words)` after it (False: it read beyond the fresh words).

    In place, put(row) is `target[:] = rows[row]` plus `(view, data)` writes in `extra` and a
    `reset(row)` call: the loader's loop does those itself, saving a Python call per sample."""

    def __init__(self, name: str, template: bytes, words_at: int, seed_at: int | None, target: int | None = None,
                 fits: Callable[[int], bool] | None = None, position: Callable[[], int] | None = None,
                 extra: tuple = (), reset: Callable[[int], None] | None = None, head_only: bool = False,
                 position_views: tuple | None = None):
        np = sys.modules["numpy"]
        self.name = name
        self.template = np.frombuffer(template, dtype=np.uint8)
        self.words_at, self.seed_at = words_at, seed_at
        self._memory = None if target is None else memoryview((ctypes.c_char * len(template)).from_address(target)).cast("B")
        # head_only: only the bytes up to the last fresh word are written (torch: a sample that fits
        # never read the words after them, so they need not be fresh or known)
        self._head_only = head_only
        self.extra = extra  # (memoryview, bytes) also written per sample: cached normals
        self.reset = reset  # called per sample with the row: Python's cached Gaussian
        self.fits = fits or (lambda words: True)
        self.position_views = position_views  # torch in place: its (left, next) as ctypes integers, read by the loader's loop
        self.position = position or (lambda: 0)
        # counters (times the golden ratio, wrapping) of this RNG's pairs, and of the seed first if it has one
        offsets = ([0] if seed_at is not None else []) + list(range(OFFSETS[name], OFFSETS[name] + _PAIRS))
        self._counters = np.asarray(offsets, dtype=np.uint64) * np.uint64(_GOLDEN)
        self._keyed = (None, None)  # (key, counters + key) of the last batch
        self._step = np.uint64(_SAMPLE_STEP)
        self._images = None
        self._fresh = 0  # words of each image made fresh by the last prepare()
        self.target = None  # the memoryview a row is copied into (in place), sized like the rows
        self.rows: list = []  # per row of the last prepare(): its image as a memoryview

    @property
    def in_place(self) -> bool:
        return self._memory is not None

    def prepare(self, key, indices, words: int) -> None:
        """Make the images of a batch's samples (`indices`: a NumPy uint64 array; `key`: the epoch's
        key, or an array of one per sample), each with its first `words` words fresh (all where the
        layout is not confirmed); `rows` holds them until the next call."""
        np = sys.modules["numpy"]
        words = MT_WORDS if not self.in_place else min(MT_WORDS, words)
        pairs = (words + 1) // 2
        rows = len(indices)
        images = self._images
        if images is None or images.shape[0] != rows:
            images = self._images = np.tile(self.template, (rows, 1))
            self._fresh = -1
        start, seeded = self.words_at, self.seed_at is not None
        if 2 * pairs < self._fresh:  # fewer fresh words than last time: the rest back to the template
            images[:, start + 8 * pairs:start + 4 * self._fresh] = self.template[start + 8 * pairs:start + 4 * self._fresh]
        columns = pairs + seeded
        firsts = np.multiply(indices, self._step, out=_scratch(("firsts", rows)))
        values = _scratch(("values", rows, columns), (rows, columns))  # reused: numpy's per-call cost dominates here
        if isinstance(key, int):
            if self._keyed[0] != key:
                self._keyed = (key, self._counters + np.uint64(key))
            np.add(firsts[:, None], self._keyed[1][None, :columns], out=values)
        else:
            firsts += key
            np.add(firsts[:, None], self._counters[None, :columns], out=values)
        values = splitmix_finish(values, True)
        if seeded:
            images[:, self.seed_at:self.seed_at + 8] = values[:, :1].view(np.uint8)
        images[:, start:start + 8 * pairs] = values[:, seeded:].view(np.uint8)
        fresh = min(MT_WORDS, 2 * pairs)
        if self.in_place and (fresh != self._fresh or not self.rows):
            size = start + 4 * fresh if self._head_only else images.shape[1]
            flat, stride = memoryview(images.reshape(-1)), images.shape[1]
            self.rows = [flat[row * stride:row * stride + size] for row in range(rows)]
            self.target = self._memory[:size]
        self._fresh = fresh

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
        return list(struct.unpack_from(f"<{MT_WORDS}I", self._images[row, start:start + 4 * MT_WORDS].tobytes()))

    def _put_api(self, row: int) -> None:
        words = self.words_of(row)
        if self.name == "python":
            random.setstate((3, tuple(words) + (0,), None))
        elif self.name == "numpy":
            np = sys.modules["numpy"]
            np.random.set_state(("MT19937", np.asarray(words, dtype=np.uint32), 0, 0, 0.0))
        else:
            torch = sys.modules["torch"]
            seed = int(self._images[row, self.seed_at:self.seed_at + 8].view(sys.modules["numpy"].uint64)[0])
            state = torch.frombuffer(bytearray(torch_state_bytes(seed, words)), dtype=torch.uint8)
            torch.default_generator.set_state(state)


def _scratch(key: tuple, shape: tuple | None = None):
    return scratch(("sample_rng",) + key, shape or key[1:], sys.modules["numpy"].uint64)


_seeders: dict = {}  # (name, ids of the RNG objects) -> Seeder


def seeder(name: str) -> Seeder:
    """The Seeder of one global RNG of this process ("python", "numpy" or "torch")."""
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    key = (name, id(random._inst), id(np), id(torch.default_generator) if torch is not None else None)
    found = _seeders.get(key)
    if found is None:
        found = _seeders[key] = _make(name)
    return found


def _tail_check(address: int, template: bytes, tail_at: int):
    """A check that the last two words still hold the template's: regenerating the block changes them all."""
    tail = ctypes.c_uint64.from_address(address + tail_at)
    expected = struct.unpack_from("<Q", template, tail_at)[0]
    return tail, expected


def _make(name: str) -> Seeder:
    template_words = struct.pack(f"<{MT_WORDS}I", *seeding._mt_init(5489))  # any valid state: MT's default
    if name == "python":
        template = struct.pack("<i", 0) + template_words  # CPython's {int index; uint32_t state[624]}
        if seeding._python_state_bytes() is None:
            return Seeder(name, template, 4, None)
        inst = random._inst
        target = id(inst) + seeding._python_state_offset[0]
        index = ctypes.c_int.from_address(target)
        tail, expected = _tail_check(target, template, 4 + 4 * (MT_WORDS - 2))

        def reset(row: int) -> None:
            inst.gauss_next = None

        return Seeder(name, template, 4, None, target, lambda words: index.value <= words and tail.value == expected,
                      lambda: index.value, reset=reset)
    if name == "numpy":
        template = template_words + struct.pack("<i", 0)  # NumPy's {uint32_t key[624]; int pos}
        if seeding._numpy_state_bytes() is None or seeding._numpy_gauss_address() is None:
            return Seeder(name, template, 0, None)
        generator = sys.modules["numpy"].random.mtrand._rand._bit_generator
        target, gauss_at = seeding._numpy_state_address[id(generator)], seeding._numpy_gauss_address()
        pos = ctypes.c_int.from_address(target + 4 * MT_WORDS)
        tail, expected = _tail_check(target, template, 4 * (MT_WORDS - 2))
        gauss = memoryview((ctypes.c_char * 16).from_address(gauss_at)).cast("B")
        return Seeder(name, template, 0, None, target, lambda words: pos.value <= words and tail.value == expected,
                      lambda: pos.value, extra=((gauss, bytes(16)),))
    layout, target = seeding.torch_layout(), seeding.torch_state_address()
    if layout is None or target is None:
        # The image layout of get_state() bytes is not used by the API path: only words and seed are read.
        template = bytes(8) + struct.pack("<iiI", MT_WORDS, 1, 0) + template_words
        return Seeder(name, template, 20, 0)
    left = ctypes.c_int32.from_address(target + layout.left)
    next_ = ctypes.c_uint32.from_address(target + layout.next)
    words_end = layout.words + 4 * MT_WORDS  # after the words: the cached normals, cleared per sample
    normals = memoryview((ctypes.c_char * (layout.size - words_end)).from_address(target + words_end)).cast("B")

    def fits(words: int) -> bool:
        # From position 0 (left 624, next 0) without regenerating, left + next stays 624.
        position = next_.value
        return position <= words and left.value + position == MT_WORDS

    return Seeder(name, layout.template, layout.words, 0, target, fits, lambda: next_.value,
                  extra=((normals, layout.template[words_end:]),), head_only=True, position_views=(left, next_))
