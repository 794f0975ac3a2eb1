"""Seeding every RNG, and one table of RNG sources that seeding, capture and restore iterate over.

The in-place readings of the same states live beside it: rng/layouts (where each state lies in
memory), rng/snapshot (cheap copies for the loader) and rng/fingerprint (digests for the trace).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "seed_everything",
    "RngSource",
    "RNG_SOURCES",
    "capture_rng",
    "restore_rng",
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
    # NumPy is only touched if the program has imported it (or can): we never import it for seeding
    # alone.
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
    ``{"python": 0, "numpy": 0, "torch": 0}``. Sources for libraries the program has not imported
    are
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
