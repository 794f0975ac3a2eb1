"""Seeding every RNG, and one table of RNG sources that capture, restore and digest all iterate over."""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from dataclasses import dataclass
from typing import Any, Callable

from .digests import digest, digest_bytes, digest_tensor

__all__ = ["seed_everything", "RngSource", "RNG_SOURCES", "capture_rng", "restore_rng", "rng_digests"]


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


_cuda_present: list[bool] = []  # torch.cuda.is_available(), asked once: ~10 us a call, and the step trace asks every step


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
        getattr(getattr(torch, name, None), "is_available", lambda: False)() for name in ("mps", "xpu")
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
        set_state=lambda state: _torch().cuda.set_rng_state_all([own_storage(one) for one in state]),
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
    return ctypes.string_at(id(inst) + offset, 4 + 624 * 4) + (b"" if gauss is None else struct.pack("<d", gauss))


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
            for has, value in ((1, 0.8125 + 2.0 ** -40), (0, -3.5 - 2.0 ** -37)):
                probe.set_state(("MT19937", key, 3, has, value))
                memory = ctypes.string_at(id(probe), 512)
                found = {i - 8 for i in range(8, 504, 8) if memory[i:i + 8] == struct.pack("<d", value)
                         and memory[i - 8:i - 4] == struct.pack("<i", has)}
                hits.append(found)
            candidates = sorted(hits[0] & hits[1])
            if len(candidates) == 1:
                offset = candidates[0]
        except Exception:  # any other NumPy: fall back to get_state()
            offset = None
        _numpy_gauss_offset.append(offset)
    offset = _numpy_gauss_offset[0]
    return None if offset is None else id(np.random.mtrand._rand) + offset


def rng_snapshot() -> tuple:
    """The global Python, NumPy and torch CPU RNG states, read in place where the layout was checked
    (~1.9 us, against ~60 us through getstate()/get_state()), for `rng_restore` and `rng_changed`."""
    key = (id(random._inst), id(sys.modules.get("numpy")))
    read = _snapshot_readers.get(key)
    if read is None:
        _snapshot_readers.clear()
        read = _snapshot_readers[key] = _snapshot_reader()
    return read()


_snapshot_readers: dict = {}  # (id of random's generator, id of numpy) -> rng_snapshot's reader for them


def _snapshot_reader() -> Callable[[], tuple]:
    """rng_snapshot's work for the RNG objects of the moment: the in-place states are read through
    ctypes arrays made once (bytes() of one costs a third of ctypes.string_at)."""
    np, inst = _numpy(), random._inst
    python_view = numpy_views = None
    if _python_state_bytes() is not None:
        python_view = (ctypes.c_char * (4 + 624 * 4)).from_address(id(inst) + _python_state_offset[0])
    if np is not None and _numpy_state_bytes() is not None and _numpy_gauss_address() is not None:
        generator = np.random.mtrand._rand._bit_generator
        numpy_views = ((ctypes.c_char * (624 * 4 + 4)).from_address(_numpy_state_address[id(generator)]),
                       (ctypes.c_char * 16).from_address(_numpy_gauss_address()))
    get_state, string_at = _torch().default_generator.get_state, ctypes.string_at
    size = get_state().numel()

    def read() -> tuple:
        python = (bytes(python_view), inst.gauss_next) if python_view is not None else random.getstate()
        if numpy_views is not None:
            numpy = (bytes(numpy_views[0]), bytes(numpy_views[1]))
        else:
            numpy = None if np is None else np.random.get_state()
        state = get_state()
        return python, numpy, (state, string_at(state.data_ptr(), size))

    return read


def rng_restore(snapshot: tuple, only: set[str] | frozenset | None = None) -> None:
    """Put back the states taken by `rng_snapshot` (of the RNGs named in `only`, if given)."""
    python, numpy, (torch_state, _) = snapshot
    if only is None or "python" in only:
        if _in_place(python):
            ctypes.memmove(id(random._inst) + _python_state_offset[0], python[0], 4 + 624 * 4)
            random._inst.gauss_next = python[1]
        else:
            random.setstate(python)
    if numpy is not None and (only is None or "numpy" in only):
        if _in_place(numpy):
            generator = _numpy().random.mtrand._rand._bit_generator
            ctypes.memmove(_numpy_state_address[id(generator)], numpy[0], 624 * 4 + 4)
            ctypes.memmove(_numpy_gauss_address(), numpy[1], 16)
        else:
            _numpy().random.set_state(numpy)
    if only is None or "torch" in only:
        _torch().default_generator.set_state(torch_state)


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


def splitmix(base, counters, out=None):
    """SplitMix64 outputs for `counters` (a NumPy uint64 array) from `base` (a 64-bit integer, or
    an array of them broadcast against `counters`): bijective in the counter. `out` receives them
    (a buffer reused from call to call saves allocating, and page-faulting, a large one)."""
    np = _numpy()
    z = np.multiply(counters, np.uint64(_GOLDEN), out=out)  # the standard form: base + counter * golden
    z += np.asarray(base, dtype=np.uint64)
    return _splitmix_finish(z, out is not None)


def _splitmix_finish(z, reuse: bool):
    """SplitMix64's output function, in place on `z` (base + counter * golden)."""
    np = _numpy()
    shifted = _scratch(("shifted", z.shape), z.shape, np.uint64) if reuse else np.empty_like(z)
    for shift, factor in ((30, _MIX1), (27, _MIX2), (31, None)):
        np.right_shift(z, np.uint64(shift), out=shifted)
        z ^= shifted
        if factor is not None:
            z *= np.uint64(factor)
    return z


_WEYL: dict = {}  # stream -> its 312 counters times golden, made on first use


def mt_states(seeds: list[int], stream: int, *, position_first: bool):
    """An MT19937 state per seed, all at once, as rows of 625 uint32: the 624 words filled from
    SplitMix64 (312 outputs) and the position 0 before or after them (the layouts of CPython's
    `random` and NumPy's MT19937). Position 0 means the next draws read the words themselves
    (tempered), and the block is regenerated only after 624 of them: seeding through random.seed
    costs ~4 us, and the first draw after it regenerates the whole block (~1 us) first.
    Row i depends only on seeds[i] and `stream`. The array returned is reused by the next call
    with as many seeds and the same layout."""
    np = _numpy()
    rows = len(seeds)
    # Each seed starts a SplitMix64 sequence; a stream takes its outputs stream*312+1 .. stream*312+312,
    # so the streams of one seed are disjoint stretches of one sequence.
    weyl = _WEYL.get(stream)
    if weyl is None:
        weyl = _WEYL[stream] = np.arange(stream * 312 + 1, stream * 312 + 313, dtype=np.uint64) * np.uint64(_GOLDEN)
    words = np.add(np.asarray(seeds, dtype=np.uint64)[:, None], weyl[None, :], out=_scratch(("words", rows), (rows, 312), np.uint64))
    words = _splitmix_finish(words, True).view(np.uint32)
    out = _scratch(("out", rows, position_first), (rows, 625), np.uint32)
    if position_first:
        out[:, 0], out[:, 1:] = 0, words
    else:
        out[:, :624], out[:, 624] = words, 0
    return out


_buffers: dict = {}


def _scratch(key, shape, dtype):
    buffer = _buffers.get(key)
    if buffer is None:
        if len(_buffers) > 32:
            _buffers.clear()  # batch sizes vary (a last, shorter batch): keep a few
        buffer = _buffers[key] = _numpy().empty(shape, dtype=dtype)
    return buffer


def python_state_writer():
    """A function copying a row of `mt_states(..., position_first=True)` (given by its address)
    into Python's global `random` in place, or None where the layout was not confirmed (then
    random.seed is the way)."""
    if not _python_state_offset:
        _python_state_bytes()
    offset = _python_state_offset[0]
    if offset is None:
        return None
    memmove, inst = ctypes.memmove, random._inst
    target = id(inst) + offset

    def put(address: int) -> None:
        memmove(target, address, 4 + 624 * 4)
        inst.gauss_next = None

    return put


def numpy_state_writer():
    """The same for NumPy's legacy global RandomState, rows `position_first=False` (its key, position
    and cached Gaussian), or None."""
    np = sys.modules.get("numpy")
    if np is None or _numpy_state_bytes() is None or _numpy_gauss_address() is None:
        return None
    generator = np.random.mtrand._rand._bit_generator
    state_at, gauss_at = _numpy_state_address[id(generator)], _numpy_gauss_address()
    memmove, no_gauss = ctypes.memmove, bytes(16)

    def put(address: int) -> None:
        memmove(state_at, address, 624 * 4 + 4)
        memmove(gauss_at, no_gauss, 16)

    return put


def rng_digests() -> dict[str, str]:
    """A digest of each available RNG's state: cheap evidence of whether two runs drew the same numbers."""
    out = {}
    for source in RNG_SOURCES:
        if source.name == "accelerator" or not source.available():
            continue
        if source.name == "numpy":
            fast = _numpy_state_bytes()
            if fast is not None:
                out["numpy"] = digest_bytes(fast)
                continue
        if source.name == "python":
            fast = _python_state_bytes()
            if fast is not None:
                out["python"] = digest_bytes(fast)
                continue
        state = source.get_state()
        if source.name == "torch":
            out["torch"] = digest_tensor(state)
            continue
        if source.name == "python":
            # 625 Python ints: packing them is ~50x faster than digesting them one by one.
            version, words, gauss = state
            state = (version, struct.pack(f"<{len(words)}Q", *words), gauss)
        out[source.name] = digest(state)
    return out
