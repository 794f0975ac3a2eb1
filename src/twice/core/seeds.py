"""Derived seeds: stable, independent seeds per purpose, the same in every process and platform."""

from __future__ import annotations

import hashlib

SEED_MAX = 2**63 - 1


def _encode(part: object) -> bytes:
    # A type tag and a length prefix keep ("a", "bc") and ("ab", "c") apart, and 1 apart from "1".
    if isinstance(part, bool):
        raise TypeError("derive_seed does not take booleans; pass an int or a str")
    if isinstance(part, int):
        body, tag = str(part).encode(), b"i"
    elif isinstance(part, str):
        body, tag = part.encode("utf-8"), b"s"
    elif isinstance(part, bytes):
        body, tag = part, b"b"
    else:
        raise TypeError(f"derive_seed takes ints, strs or bytes, not {type(part).__name__}")
    return tag + len(body).to_bytes(8, "little") + body


def derive_seed(root: int, *names: int | str | bytes) -> int:
    """Return a seed in [0, 2**63) derived from `root` and `names`.

    The value depends only on the arguments (BLAKE2b of a canonical encoding), never on
    Python's `hash()`, the process, the platform or the Python version.

    >>> derive_seed(0, "data") == derive_seed(0, "data")
    True
    >>> derive_seed(0, "data") != derive_seed(0, "init")
    True
    """
    digest = hashlib.blake2b(person=b"twice.seed.v1", digest_size=8)
    digest.update(_encode(root))
    for name in names:
        digest.update(_encode(name))
    return int.from_bytes(digest.digest(), "little") & SEED_MAX


def seed_deriver(root: int, *prefix: int | str | bytes):
    """A function f(*names) equal to derive_seed(root, *prefix, *names), for many seeds under one
    prefix.

    The hash state after the prefix is computed once and copied per call (the loader derives a
    seed per sample: ~0.5 us instead of ~2 us)."""
    base = hashlib.blake2b(person=b"twice.seed.v1", digest_size=8)
    base.update(_encode(root))
    for name in prefix:
        base.update(_encode(name))

    def derive(*names: int | str | bytes) -> int:
        digest = base.copy()
        for name in names:
            digest.update(_encode(name))
        return int.from_bytes(digest.digest(), "little") & SEED_MAX

    return derive
