"""Seeding every RNG, and one table of RNG sources that capture, restore and digest all iterate over."""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twice.core import digests as _digests
from twice.core.digests import digest, digest_buffers, digest_tensor

__all__ = [
    "seed_everything",
    "RngSource",
    "RNG_SOURCES",
    "capture_rng",
    "restore_rng",
    "rng_digests",
]


@dataclass(frozen=True)
class RngSource:
    """One global RNG: how to tell it exists, seed it, read its state and put the state back."""

    name: str
    available: Callable[[], bool]
    seed: Callable[[int], None]
    get_state: Callable[[], Any]
    set_state: Callable[[Any], None]


def _numpy():
    # NumPy is only touched if the program has imported it (or can): we never import it for seeding alone.
    return sys.modules.get("numpy")


def _torch():
    return sys.modules.get("torch")


def _numpy_seed(seed: int) -> None:
    # The legacy global RNG takes at most 32-bit integers; a wider seed is passed as two words.
    np = _numpy()
    np.random.seed(seed if seed < 2**32 else [seed & 0xFFFFFFFF, seed >> 32])


def seed_cpu_rngs(seed: int) -> None:
    """Seed Python's `random`, NumPy's global RNG and torch's CPU generator (not CUDA's: those are
    the training loop's): the state a loader's sampler or collate_fn draws from."""
    random.seed(seed)
    _numpy_seed(seed)
    _torch().default_generator.manual_seed(seed)


_cuda_present: list[
    bool
] = []  # torch.cuda.is_available(), asked once: ~10 us a call, and the step trace asks every step


def _cuda_ready() -> bool:
    torch = _torch()
    if torch is None:
        return False
    if not _cuda_present:
        _cuda_present.append(bool(torch.cuda.is_available()))
    # Reading CUDA RNG state would initialise CUDA; only do it when the program already has.
    return _cuda_present[0] and torch.cuda.is_initialized()


def _accelerator_seed(seed: int) -> None:
    torch = _torch()
    for name in ("mps", "xpu"):
        module = getattr(torch, name, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            module.manual_seed(seed)


def _accelerator_available() -> bool:
    torch = _torch()
    if torch is None:
        return False
    return any(
        getattr(getattr(torch, name, None), "is_available", lambda: False)()
        for name in ("mps", "xpu")
    )


def own_storage(state):
    """An RNG state tensor that starts its own storage. torch's Generator.set_state reads from the
    start of the storage, not of the tensor: given a view at an offset (one row of stacked states,
    a slice of a loaded buffer) it restores another state or crashes the process (torch 2.13)."""
    return state if state.storage_offset() == 0 and state.is_contiguous() else state.clone()


RNG_SOURCES: tuple[RngSource, ...] = (
    RngSource(
        "python",
        available=lambda: True,
        seed=lambda s: random.seed(s),
        get_state=random.getstate,
        set_state=random.setstate,
    ),
    RngSource(
        "numpy",
        available=lambda: _numpy() is not None,
        seed=_numpy_seed,
        get_state=lambda: _numpy().random.get_state(),
        set_state=lambda state: _numpy().random.set_state(state),
    ),
    RngSource(
        "torch",
        available=lambda: _torch() is not None,
        # torch.manual_seed also queues the seed for every CUDA device, without initialising CUDA.
        seed=lambda s: _torch().manual_seed(s),
        get_state=lambda: _torch().get_rng_state(),
        set_state=lambda state: _torch().set_rng_state(own_storage(state)),
    ),
    RngSource(
        "cuda",
        available=_cuda_ready,
        seed=lambda s: _torch().cuda.manual_seed_all(s),
        get_state=lambda: _torch().cuda.get_rng_state_all(),
        set_state=lambda state: _torch().cuda.set_rng_state_all(
            [own_storage(one) for one in state]
        ),
    ),
    RngSource(
        "accelerator",
        available=_accelerator_available,
        seed=_accelerator_seed,
        get_state=lambda: None,
        set_state=lambda state: None,
    ),
)


def seed_everything(seed: int) -> dict[str, int]:
    """Seed Python's `random`, NumPy's global RNG, torch on the CPU and on every device.

    Returns the seed given to each source that exists in this process, e.g.
    ``{"python": 0, "numpy": 0, "torch": 0}``. Sources for libraries the program has not imported are
    skipped; `twice run` seeds them the moment they are imported.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), not {seed!r}")
    seeded = {}
    for source in RNG_SOURCES:
        if source.available():
            source.seed(seed)
            seeded[source.name] = seed
    torch = _torch()
    if torch is not None and "cuda" not in seeded and torch.cuda.is_available():
        seeded["cuda"] = seed  # queued by torch.manual_seed, applied when CUDA initialises
    return seeded


def capture_rng() -> dict[str, Any]:
    """The current state of every available RNG source (live objects, for `restore_rng`)."""
    return {source.name: source.get_state() for source in RNG_SOURCES if source.available()}


def restore_rng(states: dict[str, Any]) -> None:
    """Put back states taken by `capture_rng`; a source missing from `states` is left alone."""
    for source in RNG_SOURCES:
        if source.name in states and source.available():
            source.set_state(states[source.name])


_numpy_state_address: dict[int, int] = {}


def _numpy_state_bytes() -> bytes | None:
    """The legacy global MT19937 state read in place (np.random.get_state() costs ~50 us per call)."""
    np = _numpy()
    try:
        generator = np.random.mtrand._rand._bit_generator
        if type(generator).__name__ != "MT19937":
            return None
        key = id(generator)
        if key not in _numpy_state_address:
            _numpy_state_address[key] = generator.ctypes.state_address
        # struct s_mt19937_state { uint32_t key[624]; int pos; }
        return ctypes.string_at(_numpy_state_address[key], 624 * 4 + 4)
    except (AttributeError, TypeError):
        return None


_python_state_offset: list = []  # [offset] once checked, [None] where the layout is not the one read here


def _python_state_bytes() -> bytes | None:
    """The global `random` state (MT19937 words and position) read in place: random.getstate()
    builds a tuple of 625 Python ints (~12 us, and as much again to pack them) on every step.

    CPython's RandomObject is {PyObject_HEAD; int index; uint32_t state[624]}. The layout is
    checked once against getstate() on a private generator; any other layout (another
    interpreter, a free-threaded build) falls back to getstate()."""
    if not _python_state_offset:
        offset = None
        if sys.implementation.name == "cpython":
            probe = random.Random(12345)
            probe.random()
            version, words, _ = probe.getstate()
            expected = struct.pack("<i", words[-1]) + struct.pack("<624I", *words[:-1])
            candidate = 2 * ctypes.sizeof(ctypes.c_void_p)
            if ctypes.string_at(id(probe) + candidate, 4 + 624 * 4) == expected:
                offset = candidate
        _python_state_offset.append(offset)
    offset = _python_state_offset[0]
    if offset is None:
        return None
    inst = random._inst
    gauss = inst.gauss_next
    return ctypes.string_at(id(inst) + offset, 4 + 624 * 4) + (
        b"" if gauss is None else struct.pack("<d", gauss)
    )


_numpy_gauss_offset: list = []  # [offset of RandomState's (has_gauss, gauss)] once checked, [None] if not found


def _numpy_gauss_address() -> int | None:
    """Where the legacy global RandomState keeps its cached Gaussian (has_gauss, gauss), found once.

    NumPy's RandomState holds it in a C struct {bitgen_t *; int has_gauss; double gauss} that no
    Python attribute exposes; get_state() reads it at ~40 us a call. The offset is found on a private
    RandomState by planting two known values through set_state and reading them back."""
    np = _numpy()
    if not _numpy_gauss_offset:
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
        _numpy_gauss_offset.append(offset)
    offset = _numpy_gauss_offset[0]
    return None if offset is None else id(np.random.mtrand._rand) + offset


MT_WORDS = 624  # an MT19937 state's 32-bit words
_TORCH_STATE_SIZE = 5056  # torch's CPU get_state(): {i64 seed; i32 left, seeded; u64 next; u64 words[624]; normal caches}


@dataclass(frozen=True)
class TorchLayout:
    """Where a CPU torch.Generator keeps its state in memory, as offsets from its seed field (whose
    address torch_state_address() gives for the default generator): the region runs from the seed
    over the position, the 624 words and the two cached normals, so one memcpy puts a whole state in place."""

    size: int  # bytes of the region
    next: int  # uint32: index of the next word read (after i32 left, draws before regenerating)
    words: int  # uint32[624]
    template: bytes  # the region of a state at position 0 (left 624, next 0) with no cached normal


_torch_layout: list = []  # [TorchLayout] once checked, [None] where the layout is not the one read here


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
    """The get_state() bytes of a CPU generator holding `words` (624 uint32) at a position, no cached normal."""
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
    if _torch_layout:
        return _torch_layout[0]
    layout = None
    torch = _torch()
    try:
        if torch is not None and sys.implementation.name == "cpython" and sys.byteorder == "little":
            layout = _find_torch_layout(torch)
    except Exception:  # any other build: the official API
        layout = None
    _torch_layout.append(layout)
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
    # The cached normals (std::optional<float>, std::optional<double>) follow: plant values, find them.
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
    address = _torch_state_address.get(key)
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
        address = _torch_state_address[key] = impl + at - 20
    return address


_torch_state_address: dict[int, int] = {}


def rng_snapshot() -> tuple:
    """The global Python, NumPy and torch CPU RNG states, read in place where the layout was checked
    (~0.6 us, against ~60 us through getstate()/get_state()), for `rng_restore` and `rng_changed`."""
    return _rng_access()[0]()


def rng_restore(snapshot: tuple, only: set[str] | frozenset | None = None) -> None:
    """Put back the states taken by `rng_snapshot` (of the RNGs named in `only`, if given)."""
    _rng_access()[1](snapshot, only)


def _rng_access() -> tuple[Callable[[], tuple], Callable[[tuple, Any], None]]:
    torch = _torch()
    key = (
        id(random._inst),
        id(sys.modules.get("numpy")),
        id(torch.default_generator) if torch is not None else None,
    )
    access = _snapshot_readers.get(key)
    if access is None:
        _snapshot_readers.clear()
        access = _snapshot_readers[key] = _snapshot_access()
    return access


_snapshot_readers: dict = {}  # ids of random's generator, numpy and torch's default generator -> _snapshot_access()


def _snapshot_access() -> tuple[Callable[[], tuple], Callable[[tuple, Any], None]]:
    """rng_snapshot's and rng_restore's work for the RNG objects of the moment. The in-place states
    are copied through memoryviews made once: the loader takes a snapshot before and after every
    batch and restores one, and a memoryview's tobytes() or slice assignment costs a quarter of
    bytes() of a ctypes array or ctypes.memmove."""
    np, inst = _numpy(), random._inst
    python_view, numpy_view, gauss_view = _state_views()
    python_mv = None if python_view is None else memoryview(python_view).cast("B")
    numpy_mvs = None
    if numpy_view is not None and gauss_view is not None:
        numpy_mvs = (memoryview(numpy_view).cast("B"), memoryview(gauss_view).cast("B"))
    generator = _torch().default_generator
    get_state, set_state, string_at = generator.get_state, generator.set_state, ctypes.string_at
    size = get_state().numel()
    torch_at = torch_state_address()
    torch_mv = (
        None
        if torch_at is None
        else memoryview((ctypes.c_char * torch_layout().size).from_address(torch_at)).cast("B")
    )

    def read() -> tuple:
        python = (
            (python_mv.tobytes(), inst.gauss_next) if python_mv is not None else random.getstate()
        )
        if numpy_mvs is not None:
            numpy = (numpy_mvs[0].tobytes(), numpy_mvs[1].tobytes())
        else:
            numpy = None if np is None else np.random.get_state()
        if torch_mv is not None:
            return python, numpy, (None, torch_mv.tobytes())  # its state region, in place
        state = get_state()
        return python, numpy, (state, string_at(state.data_ptr(), size))

    def restore(snapshot: tuple, only) -> None:
        python, numpy, (torch_state, torch_bytes) = snapshot
        if only is None or "python" in only:
            if python_mv is not None and _in_place(python):
                python_mv[:] = python[0]
                inst.gauss_next = python[1]
            else:
                random.setstate(python)
        if numpy is not None and (only is None or "numpy" in only):
            if numpy_mvs is not None and _in_place(numpy):
                numpy_mvs[0][:] = numpy[0]
                numpy_mvs[1][:] = numpy[1]
            else:
                np.random.set_state(numpy)
        if only is None or "torch" in only:
            if torch_state is None:  # taken in place
                torch_mv[:] = torch_bytes
            else:
                set_state(torch_state)

    return read, restore


def rng_changed(before: tuple, after: tuple) -> set[str]:
    """Which of "python", "numpy", "torch" differ between two snapshots."""
    changed = set()
    if before[0] != after[0]:
        changed.add("python")
    if before[1] is not None and not _same_numpy(before[1], after[1]):
        changed.add("numpy")
    if before[2][1] != after[2][1]:
        changed.add("torch")
    return changed


def _in_place(state) -> bool:
    """Whether a snapshot entry was read in place (bytes, extra) rather than through getstate()/get_state()."""
    return isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], bytes)


def _same_numpy(a, b) -> bool:
    if _in_place(a):
        return a == b
    return a[0] == b[0] and (a[1] == b[1]).all() and tuple(a[2:]) == tuple(b[2:])


_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def splitmix_finish(z, reuse: bool = False):
    """SplitMix64's output function, in place on `z` (a NumPy uint64 array of base + counter * golden,
    wrapping): bijective in the counter. `reuse` keeps its scratch buffer for the next call."""
    np = _numpy()
    shifted = _scratch(("shifted", z.shape), z.shape, np.uint64) if reuse else np.empty_like(z)
    for shift, factor in ((30, _MIX1), (27, _MIX2), (31, None)):
        np.right_shift(z, np.uint64(shift), out=shifted)
        z ^= shifted
        if factor is not None:
            z *= np.uint64(factor)
    return z


_buffers: dict = {}


def _scratch(key, shape, dtype):
    buffer = _buffers.get(key)
    if buffer is None:
        if len(_buffers) > 32:
            _buffers.clear()  # batch sizes vary (a last, shorter batch): keep a few
        buffer = _buffers[key] = _numpy().empty(shape, dtype=dtype)
    return buffer


_views: dict = {}  # (ids of random's generator and NumPy's bit generator) -> _state_views()


def _state_views() -> tuple:
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
    views = _views.get(key)
    if views is None:
        python_view = numpy_view = gauss_view = None
        if _python_state_bytes() is not None:
            python_view = (ctypes.c_char * (4 + 624 * 4)).from_address(
                id(random._inst) + _python_state_offset[0]
            )
        if np is not None and _numpy_state_bytes() is not None:
            numpy_view = (ctypes.c_char * (624 * 4 + 4)).from_address(
                _numpy_state_address[id(generator)]
            )
            if _numpy_gauss_address() is not None:
                gauss_view = (ctypes.c_char * 16).from_address(_numpy_gauss_address())
        if len(_views) > 16:
            _views.clear()
        views = _views[key] = (python_view, numpy_view, gauss_view)
    return views


_rng_plans: dict = {}  # id of a _state_views() tuple -> (it, the hash items rng_digests reuses every step: see _rng_plan)


def _rng_plan(views: tuple) -> tuple | None:
    """What rng_digests hashes, fixed for one pair of generator objects: the names and hash items
    of the states read in place (Python's and NumPy's, without their cached Gaussians) and the
    sources other than torch's CPU generator left to ask. None without twice._native. Built once:
    the step trace asks every step, on code and data the step has evicted from the caches, where
    each Python call costs ten times its warm cost."""
    if _digests._native is None:
        return None
    entry = _rng_plans.get(id(views))
    if (
        entry is not None and entry[0] is views
    ):  # (ctypes arrays are not hashable: keyed by the tuple's id, and checked)
        return entry[1]
    python_view, numpy_view, _ = views
    named = [
        (name, view)
        for name, view in (("python", python_view), ("numpy", numpy_view))
        if view is not None
    ]
    covered = {name for name, _ in named} | {"torch", "accelerator"}
    if len(_rng_plans) > 16:
        _rng_plans.clear()
    plan = (
        [name for name, _ in named],
        [_digests.buffers_item(view) for _, view in named],
        tuple(source for source in RNG_SOURCES if source.name not in covered),
    )
    _rng_plans[id(views)] = (views, plan)
    return plan


def rng_digests() -> dict[str, str]:
    """A digest of each available RNG's state: cheap evidence of whether two runs drew the same numbers."""
    views = _state_views()
    python_view, numpy_view, gauss_view = views
    plan = _rng_plan(views)
    if plan is None:
        return _rng_digests_slow(python_view, numpy_view, gauss_view)
    # The step trace's every step: one call to the C module, the in-place items made once (the
    # same values as digest_buffers and digest_tensor give).
    names, items, others = plan
    names, items = list(names), list(items)
    gauss = random._inst.gauss_next if python_view is not None else None
    if gauss is not None:  # Python's state is the plan's first item where it is read in place
        items[0] = _digests.buffers_item(python_view, struct.pack("<d", gauss))
    if (
        gauss_view is not None and gauss_view[:4] != b"\0\0\0\0"
    ):  # NumPy holds a Gaussian: {int has_gauss; double gauss}
        items[-1] = _digests.buffers_item(numpy_view, bytes(gauss_view)[8:])
    torch = _torch()
    state = torch.default_generator.get_state() if torch is not None else None  # held until hashed
    item = (
        _digests.tensor_item(state) if state is not None else None
    )  # (the item holds its address only)
    if item is not None:
        names.append("torch")
        items.append(item)
    out = dict(zip(names, _digests.hash_items(items)))
    if state is not None and item is None:
        out["torch"] = digest_tensor(state)
    for source in others:
        if source.available():
            out[source.name] = _source_digest(source)
    return out


def _rng_digests_slow(python_view, numpy_view, gauss_view) -> dict[str, str]:
    """rng_digests without twice._native: the same values."""
    in_place: dict[str, tuple] = {}
    if python_view is not None:
        gauss = random._inst.gauss_next
        in_place["python"] = (
            (python_view,) if gauss is None else (python_view, struct.pack("<d", gauss))
        )
    if numpy_view is not None:
        cached = (
            bytes(gauss_view) if gauss_view is not None else bytes(16)
        )  # {int has_gauss; double gauss}
        in_place["numpy"] = (numpy_view, cached[8:]) if cached[:4] != bytes(4) else (numpy_view,)
    out = {name: digest_buffers(*parts) for name, parts in in_place.items()}
    for source in RNG_SOURCES:
        if source.name != "accelerator" and source.name not in out and source.available():
            out[source.name] = _source_digest(source)
    return out


def _source_digest(source: RngSource) -> str:
    """One RNG's digest from its state as get_state() gives it (the states not read in place)."""
    state = source.get_state()
    if source.name == "torch":
        return digest_tensor(state)
    if source.name == "python":
        # 625 Python ints: packing them is ~50x faster than digesting them one by one.
        version, words, gauss = state
        state = (version, struct.pack(f"<{len(words)}Q", *words), gauss)
    return digest(state)
