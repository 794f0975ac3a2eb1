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
        set_state=lambda state: _torch().set_rng_state(state),
    ),
    RngSource(
        "cuda",
        available=_cuda_ready,
        seed=lambda s: _torch().cuda.manual_seed_all(s),
        get_state=lambda: _torch().cuda.get_rng_state_all(),
        set_state=lambda state: _torch().cuda.set_rng_state_all(state),
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
