"""SplitMix64's output function over NumPy arrays: the per-sample seeds of the loader's RNG
states."""

from __future__ import annotations

from twice.rng.seeding import _numpy

__all__ = ["splitmix_finish"]

_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def splitmix_finish(z, reuse: bool = False):
    """SplitMix64's output function, in place on `z` (a NumPy uint64 array of base + counter *
    golden,
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
