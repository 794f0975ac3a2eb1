"""Where each global RNG keeps its state in memory: Python's, NumPy's and torch's CPU generator.

Reading a state in place costs well under a microsecond where getstate()/get_state() cost 10-60
us, and the loader and the step trace read them every batch and every step. Each layout is
confirmed once against the official API on a private generator; where it does not match (another
interpreter or library version) the readers return None and callers use the official API.
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from dataclasses import dataclass

from twice.rng.seeding import _numpy, _torch

__all__ = [
    "Confirmed",
    "CONFIRMED",
    "MT_WORDS",
    "TorchLayout",
    "torch_layout",
    "torch_state_address",
    "torch_state_bytes",
    "readable",
]


class Confirmed:
    """What this process has confirmed of the RNGs' memory layouts, each found once: offsets as a
    one-element list (`[None]` where the layout is not the one read here, `[]` before the check),
    addresses by generator, and the views of state_views(). `CONFIRMED` is the process's; a test
    replaces it with `Confirmed(trusted=False)` to take every state through the libraries' APIs."""

    def __init__(self, trusted: bool = True):
        """Nothing checked yet; or, untrusted, every layout taken as not confirmed."""
        unknown = [] if trusted else [None]
        self.python_state_offset: list = list(unknown)
        self.numpy_gauss_offset: list = list(unknown)
        self.torch_layout: list = list(unknown)
        self.numpy_state_address: dict[int, int] = {}
        self.torch_state_address: dict[int, int] = {}
        self.views: dict = {}  # (ids of random's and NumPy's generators) -> state_views()


CONFIRMED = Confirmed()


def _numpy_state_bytes() -> bytes | None:
    """The legacy global MT19937 state read in place (np.random.get_state() costs ~50 us per
    call)."""
    np = _numpy()
    try:
        generator = np.random.mtrand._rand._bit_generator
        if type(generator).__name__ != "MT19937":
            return None
        key = id(generator)
        if key not in CONFIRMED.numpy_state_address:
            CONFIRMED.numpy_state_address[key] = generator.ctypes.state_address
        # struct s_mt19937_state { uint32_t key[624]; int pos; }
        return ctypes.string_at(CONFIRMED.numpy_state_address[key], 624 * 4 + 4)
    except (AttributeError, TypeError):
        return None


def _python_state_bytes() -> bytes | None:
    """The global `random` state (MT19937 words and position) read in place: random.getstate()
    builds a tuple of 625 Python ints (~12 us, and as much again to pack them) on every step.

    CPython's RandomObject is {PyObject_HEAD; int index; uint32_t state[624]}. The layout is
    checked once against getstate() on a private generator; any other layout (another
    interpreter, a free-threaded build) falls back to getstate()."""
    if not CONFIRMED.python_state_offset:
        offset = None
        if sys.implementation.name == "cpython":
            probe = random.Random(12345)
            probe.random()
            version, words, _ = probe.getstate()
            expected = struct.pack("<i", words[-1]) + struct.pack("<624I", *words[:-1])
            candidate = 2 * ctypes.sizeof(ctypes.c_void_p)
            if ctypes.string_at(id(probe) + candidate, 4 + 624 * 4) == expected:
                offset = candidate
        CONFIRMED.python_state_offset.append(offset)
    offset = CONFIRMED.python_state_offset[0]
    if offset is None:
        return None
    inst = random._inst
    gauss = inst.gauss_next
    return ctypes.string_at(id(inst) + offset, 4 + 624 * 4) + (
        b"" if gauss is None else struct.pack("<d", gauss)
    )


# [offset of RandomState's (has_gauss, gauss)] once checked, [None] if not found
def _numpy_gauss_address() -> int | None:
    """Where the legacy global RandomState keeps its cached Gaussian (has_gauss, gauss), found once.

    NumPy's RandomState holds it in a C struct {bitgen_t *; int has_gauss; double gauss} that no
    Python attribute exposes; get_state() reads it at ~40 us a call. The offset is found on a
    private
    RandomState by planting two known values through set_state and reading them back."""
    np = _numpy()
    if not CONFIRMED.numpy_gauss_offset:
        offset = None
        try:
            probe = np.random.RandomState(7)
            key = probe.get_state()[1]
            hits = []
            for has, value in ((1, 0.8125 + 2.0**-40), (0, -3.5 - 2.0**-37)):
                probe.set_state(("MT19937", key, 3, has, value))
                memory = ctypes.string_at(id(probe), 512)
                found = {
                    i - 8
                    for i in range(8, 504, 8)
                    if memory[i : i + 8] == struct.pack("<d", value)
                    and memory[i - 8 : i - 4] == struct.pack("<i", has)
                }
                hits.append(found)
            candidates = sorted(hits[0] & hits[1])
            if len(candidates) == 1:
                offset = candidates[0]
        except Exception:  # any other NumPy: fall back to get_state()
            offset = None
        CONFIRMED.numpy_gauss_offset.append(offset)
    offset = CONFIRMED.numpy_gauss_offset[0]
    return None if offset is None else id(np.random.mtrand._rand) + offset


MT_WORDS = 624  # an MT19937 state's 32-bit words
# torch's CPU get_state(): {i64 seed; i32 left, seeded; u64 next; u64 words[624]; normal caches}
_TORCH_STATE_SIZE = 5056


@dataclass(frozen=True)
class TorchLayout:
    """Where a CPU torch.Generator keeps its state in memory, as offsets from its seed field (whose
    address torch_state_address() gives for the default generator): the region runs from the seed
    over the position, the 624 words and the two cached normals, so one memcpy puts a whole state
    in place."""

    size: int  # bytes of the region
    next: int  # uint32: index of the next word read (after i32 left, draws before regenerating)
    words: int  # uint32[624]
    template: bytes  # the region of a state at position 0 (left 624, next 0) with no cached normal


# [TorchLayout] once checked, [None] where the layout is not the one read here
def _generator_impl(generator) -> int | None:
    """The address of a torch.Generator's C++ GeneratorImpl, or None if it cannot be read safely.

    A Python torch.Generator is {PyObject_HEAD; at::Generator cdata} and at::Generator is one
    intrusive pointer to the GeneratorImpl. Before anything reads there, the memory is offered to
    the kernel (a write into a pipe): an unreadable address is an error, not a crash."""
    address = ctypes.c_void_p.from_address(id(generator) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    return address if address and readable(address, 3072) else None


def readable(address: int, size: int) -> bool:
    """Whether `size` bytes at `address` can be read, asked of the kernel (a write of them into a
    pipe fails with EFAULT where they cannot) rather than found out by a crash."""
    import os

    read_end, write_end = os.pipe()
    try:
        return os.write(write_end, (ctypes.c_char * size).from_address(address)) == size
    except OSError:
        return False
    finally:
        os.close(read_end)
        os.close(write_end)


def _mt_init(seed: int) -> list[int]:
    """MT19937's init_genrand: the words torch's manual_seed gives a generator."""
    words = [seed & 0xFFFFFFFF]
    for j in range(1, MT_WORDS):
        words.append((1812433253 * (words[-1] ^ (words[-1] >> 30)) + j) & 0xFFFFFFFF)
    return words


def torch_state_bytes(seed: int, words, *, left: int = MT_WORDS, next_: int = 0) -> bytes:
    """The get_state() bytes of a CPU generator holding `words` (624 uint32) at a position, no
    cached normal."""
    out = bytearray(_TORCH_STATE_SIZE)
    struct.pack_into("<qiiQ", out, 0, seed - 2**64 if seed >= 2**63 else seed, left, 1, next_)
    struct.pack_into(f"<{MT_WORDS}Q", out, 24, *words)
    return bytes(out)


def torch_layout() -> TorchLayout | None:
    """Find, once per process, where torch's CPU generator keeps its state, and check it.

    On a private generator: manual_seed with a known seed puts known words in memory, found by
    search (with seed, position and flag beside them); the two cached normals are found by
    planting values through the official set_state; then states written into that memory are
    read back through get_state() and drawn from, against the same states set officially. Any
    mismatch leaves the layout unconfirmed (None), and callers use get_state/set_state."""
    if CONFIRMED.torch_layout:
        return CONFIRMED.torch_layout[0]
    layout = None
    torch = _torch()
    try:
        if torch is not None and sys.implementation.name == "cpython" and sys.byteorder == "little":
            layout = _find_torch_layout(torch)
    except Exception:  # any other build: the official API
        layout = None
    CONFIRMED.torch_layout.append(layout)
    return layout


def _find_torch_layout(torch) -> TorchLayout | None:
    probe = torch.Generator()
    seed = 0x5EED_2545_F491_4F6D
    probe.manual_seed(seed)
    impl = _generator_impl(probe)
    if impl is None:
        return None
    memory = ctypes.string_at(impl, 3072)
    words = struct.pack(f"<{MT_WORDS}I", *_mt_init(seed))
    at = memory.find(words)
    if at < 20 or memory.count(words) != 1:
        return None
    start = (
        at - 20
    )  # {u64 seed; i32 left; bool seeded (3 bytes padding); u32 next} before the words
    if struct.unpack_from("<QiB3xI", memory, start) != (seed, 1, 1, 0):
        return None
    end = at + 4 * MT_WORDS
    # The cached normals (std::optional<float>, std::optional<double>) follow: plant values, find
    # them.
    state = bytearray(probe.get_state().numpy().tobytes())
    flags = {}
    for float_value, double_value in ((0.8125, -3.5 - 2.0**-37), (-1.25, 0.40625 + 2.0**-40)):
        # The cached double is normal_y (torch 2.x) or normal_rho * sin(2 pi normal_x) (older): the
        # value either way, with normal_x = 1/4.
        struct.pack_into("<dddi", state, 5016, 0.25, double_value, double_value, 1)
        struct.pack_into("<f?", state, 5048, float_value, True)
        probe.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
        memory = ctypes.string_at(impl, 3072)
        found_float = {
            i
            for i in range(end, end + 64, 4)
            if memory[i : i + 5] == struct.pack("<f", float_value) + b"\x01"
        }
        found_double = {
            i
            for i in range(end, end + 64, 4)
            if memory[i : i + 9] == struct.pack("<d", double_value) + b"\x01"
        }
        flags.setdefault("float", found_float).intersection_update(found_float)
        flags.setdefault("double", found_double).intersection_update(found_double)
    if len(flags["float"]) != 1 or len(flags["double"]) != 1:
        return None
    float_at, double_at = flags["float"].pop(), flags["double"].pop()
    size = max(float_at + 5, double_at + 9) - start
    size += -size % 8
    probe.set_state(
        torch.frombuffer(bytearray(torch_state_bytes(seed, range(MT_WORDS))), dtype=torch.uint8)
    )
    region = bytearray(ctypes.string_at(impl + start, size))
    if region[float_at - start + 4] or region[double_at - start + 8]:
        return None  # set_state with no cached normal left a flag set: not the flags
    layout = TorchLayout(size=size, next=16, words=20, template=bytes(region))
    # Check: states written in place read back, and draw, as the same states set officially.
    import numpy as np

    other = torch.Generator()
    for trial in range(2):
        values = np.random.default_rng(trial).integers(0, 2**32, MT_WORDS, dtype=np.uint64).tolist()
        image = bytearray(layout.template)
        struct.pack_into("<Q", image, 0, seed + trial)
        struct.pack_into(f"<{MT_WORDS}I", image, layout.words, *values)
        ctypes.memmove(impl + start, bytes(image), size)
        official = torch_state_bytes(seed + trial, values)
        if probe.get_state().numpy().tobytes() != official:
            return None
        other.set_state(torch.frombuffer(bytearray(official), dtype=torch.uint8))
        for draw in (
            lambda g: torch.rand(700, generator=g),
            lambda g: torch.randn(5, generator=g),
            lambda g: torch.randint(0, 10**9, (9,), generator=g),
        ):
            if not torch.equal(draw(probe), draw(other)):
                return None
    return layout


def torch_state_address() -> int | None:
    """The address of the default CPU generator's state region (see TorchLayout), or None."""
    layout = torch_layout()
    if layout is None:
        return None
    torch = _torch()
    generator = torch.default_generator
    key = id(generator)
    address = CONFIRMED.torch_state_address.get(key)
    if address is None:
        impl = _generator_impl(generator)
        if impl is None:
            return None
        # The same class as the probe: find its state the same way, by its own words.
        state = generator.get_state().numpy().tobytes()
        seed, left, _, next_ = struct.unpack_from("<qiiQ", state, 0)
        words = struct.pack(f"<{MT_WORDS}I", *struct.unpack_from(f"<{MT_WORDS}Q", state, 24))
        memory = ctypes.string_at(impl, 3072)
        at = memory.find(words)
        if at < 20 or struct.unpack_from("<qi", memory, at - 20) != (seed, left):
            return None
        address = CONFIRMED.torch_state_address[key] = impl + at - 20
    return address


def state_views() -> tuple:
    """Python's MT19937 state, NumPy's, and NumPy's cached Gaussian ({int has_gauss; double gauss})
    as ctypes arrays over their memory, made once per pair of generator objects; each None where
    its layout is not confirmed. rng_snapshot copies from them, rng_digests hashes them in place."""
    np = _numpy()
    generator = getattr(
        getattr(getattr(getattr(np, "random", None), "mtrand", None), "_rand", None),
        "_bit_generator",
        None,
    )
    key = (id(random._inst), id(generator))
    views = CONFIRMED.views.get(key)
    if views is None:
        python_view = numpy_view = gauss_view = None
        if _python_state_bytes() is not None:
            python_view = (ctypes.c_char * (4 + 624 * 4)).from_address(
                id(random._inst) + CONFIRMED.python_state_offset[0]
            )
        if np is not None and _numpy_state_bytes() is not None:
            numpy_view = (ctypes.c_char * (624 * 4 + 4)).from_address(
                CONFIRMED.numpy_state_address[id(generator)]
            )
            if _numpy_gauss_address() is not None:
                gauss_view = (ctypes.c_char * 16).from_address(_numpy_gauss_address())
        if len(CONFIRMED.views) > 16:
            CONFIRMED.views.clear()
        views = CONFIRMED.views[key] = (python_view, numpy_view, gauss_view)
    return views
