"""Digests of every RNG's state: the step trace's cheap evidence that two runs drew the same
numbers.

Python's and NumPy's states are hashed where they lie (rng/layouts), torch's through its state
tensor, the rest through their official get_state(); every step makes one call into the C module.
"""

from __future__ import annotations

import random
import struct

from twice.core import digests as _digests
from twice.core import fastpath
from twice.core.digests import digest, digest_buffers, digest_tensor
from twice.rng.layouts import state_views
from twice.rng.seeding import RNG_SOURCES, RngSource, _torch

__all__ = ["rng_digests"]

# id of a state_views() tuple -> (it, the hash items rng_digests reuses every step: see _rng_plan)
_rng_plans: dict = {}


def _rng_plan(views: tuple) -> tuple | None:
    """What rng_digests hashes, fixed for one pair of generator objects: the names and hash items
    of the states read in place (Python's and NumPy's, without their cached Gaussians) and the
    sources other than torch's CPU generator left to ask. None without twice._native. Built once:
    the step trace asks every step, on code and data the step has evicted from the caches, where
    each Python call costs ten times its warm cost."""
    if _digests.native is None:
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
        [fastpath.buffers_item(view) for _, view in named],
        tuple(source for source in RNG_SOURCES if source.name not in covered),
    )
    _rng_plans[id(views)] = (views, plan)
    return plan


def rng_digests() -> dict[str, str]:
    """A digest of each available RNG's state: cheap evidence of whether two runs drew the same
    numbers."""
    views = state_views()
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
        items[0] = fastpath.buffers_item(python_view, struct.pack("<d", gauss))
    if (
        gauss_view is not None and gauss_view[:4] != b"\0\0\0\0"
    ):  # NumPy holds a Gaussian: {int has_gauss; double gauss}
        items[-1] = fastpath.buffers_item(numpy_view, bytes(gauss_view)[8:])
    torch = _torch()
    state = torch.default_generator.get_state() if torch is not None else None  # held until hashed
    item = (
        fastpath.tensor_item(state) if state is not None else None
    )  # (the item holds its address only)
    if item is not None:
        names.append("torch")
        items.append(item)
    out = dict(zip(names, fastpath.hash_items(items)))
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
