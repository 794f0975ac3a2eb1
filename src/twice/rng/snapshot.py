"""Snapshots of the global Python, NumPy and torch CPU RNG states, taken and put back in place.

The loader takes one before and after every batch (to tell which RNGs a dataset draws from) and
restores one, so they are read through memoryviews over the states' memory, made once.
"""

from __future__ import annotations

import ctypes
import random
import sys
from collections.abc import Callable
from typing import Any

from twice.rng.layouts import state_views, torch_layout, torch_state_address
from twice.rng.seeding import _numpy, _torch

__all__ = ["rng_snapshot", "rng_restore", "rng_changed"]


def rng_snapshot() -> tuple:
    """The global Python, NumPy and torch CPU RNG states, read in place where the layout was checked
    (~0.6 us, against ~60 us through getstate()/get_state()), for `rng_restore` and
    `rng_changed`."""
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
    access = READERS.get(key)
    if access is None:
        READERS.clear()
        access = READERS[key] = _snapshot_access()
    return access


# ids of random's generator, numpy and torch's default generator -> _snapshot_access()
READERS: dict = {}


def _snapshot_access() -> tuple[Callable[[], tuple], Callable[[tuple, Any], None]]:
    """rng_snapshot's and rng_restore's work for the RNG objects of the moment. The in-place states
    are copied through memoryviews made once: the loader takes a snapshot before and after every
    batch and restores one, and a memoryview's tobytes() or slice assignment costs a quarter of
    bytes() of a ctypes array or ctypes.memmove."""
    np, inst = _numpy(), random._inst
    python_view, numpy_view, gauss_view = state_views()
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
    """Whether a snapshot entry was read in place (bytes, extra) rather than through
    getstate()/get_state()."""
    return isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], bytes)


def _same_numpy(a, b) -> bool:
    if _in_place(a):
        return a == b
    return a[0] == b[0] and (a[1] == b[1]).all() and tuple(a[2:]) == tuple(b[2:])
