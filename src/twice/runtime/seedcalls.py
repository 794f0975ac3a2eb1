"""The script's own seeding calls: each seeding API of torch, NumPy and Python's `random` wrapped
the moment its module is imported, every call the script makes recorded by its line with a digest
of its value (standard library only: the bootstrap installs it).

twice's own seeding, and the seeding torch, NumPy and the standard library do inside themselves
(a DataLoader worker seeding its RNGs, `torch.manual_seed` seeding CUDA), are not the script's and
go unrecorded. A call from another installed package (a `seed_everything` helper) is the script's,
at the line of the script's that called the package. The wrappers run only when something seeds,
never per step.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from typing import Any

__all__ = ["watch_random", "watch_numpy", "watch_torch", "recorded"]

_TWICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_PACKAGES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_OWN: list[str] = []  # torch's and NumPy's folders: their seeding inside themselves is their own
_CWD = os.getcwd()

# (api, line) -> [calls, the running digest of their values, calls seeded from OS entropy]
_calls: dict[tuple[str, str], list] = {}
_watched: set[str] = set()
_kinds: dict[Any, str] = {}  # code object -> "twice", "library", "package" or "user"


def _kind(code) -> str:
    """Whose code this is: twice's, a library's seeding itself (torch, NumPy, the standard
    library), another installed package's, or the user's."""
    kind = _kinds.get(code)
    if kind is None:
        name = code.co_filename
        if name.startswith(_TWICE_DIR):
            kind = "twice"
        elif name.startswith(tuple(_OWN)):
            kind = "library"
        elif any(part in name for part in _PACKAGES) or name.startswith("<"):
            kind = "package"
        elif name.startswith(_STDLIB_DIR):
            kind = "library"
        else:
            kind = "user"
        _kinds[code] = kind
    return kind


@functools.lru_cache(maxsize=256)
def _shown(filename: str) -> str:
    return os.path.relpath(filename, _CWD) if filename.startswith(_CWD + os.sep) else filename


def _site(frame) -> str | None:
    """`file:line` of the script's call, or None where the seeding is twice's or a library's own:
    a call from an installed package is placed at the user's line that called into it."""
    if _kind(frame.f_code) in ("twice", "library"):
        return None
    caller = frame
    while caller is not None and _kind(caller.f_code) != "user":
        caller = caller.f_back
    where = caller or frame
    return f"{_shown(where.f_code.co_filename)}:{where.f_lineno}"


def _value(value: Any) -> bytes | None:
    """The bytes a seed value is digested from; None for a seed drawn from OS entropy."""
    if value is None:
        return None
    kind = f"{type(value).__module__}.{type(value).__qualname__}:".encode()
    if isinstance(value, int):
        return kind + str(int(value)).encode()
    if isinstance(value, (bytes, bytearray)):
        return kind + bytes(value)
    if hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a NumPy array of seed words
        return kind + f"{value.dtype}{getattr(value, 'shape', '')}".encode() + value.tobytes()
    return kind + repr(value).encode("utf-8", "surrogatepass")


def _record(api: str, value: Any, frame) -> None:
    site = _site(frame)
    if site is None:
        return
    entry = _calls.get((api, site))
    if entry is None:
        entry = _calls[(api, site)] = [0, None, 0]
    entry[0] += 1
    found = _value(value)
    if found is None:
        entry[2] += 1
    else:
        if entry[1] is None:
            entry[1] = hashlib.blake2b(digest_size=16)
        entry[1].update(len(found).to_bytes(8, "little") + found)


def _note(api: str, value: Any, frame) -> None:
    """Record one call; a failure to record never reaches the script, and the API is then no
    longer listed as watched (its coverage is what the manifest says)."""
    try:
        _record(api, value, frame)
    except Exception:  # noqa: BLE001 - said in the record: the API leaves `watched`
        _watched.discard(api)


def _argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _wrap(api: str, original, index: int | None, name: str = "seed"):
    """`original` recording each call's value (argument `index`/`name`; None: OS entropy)."""

    @functools.wraps(original)
    def seeding(*args, **kwargs):
        value = None if index is None else _argument(args, kwargs, index, name)
        _note(api, value, sys._getframe(1))
        return original(*args, **kwargs)

    _watched.add(api)
    return seeding


def _patch(module, attribute: str, api: str, index: int | None, name: str = "seed") -> None:
    original = getattr(module, attribute, None)
    if original is not None and not hasattr(original, "__wrapped__"):
        setattr(module, attribute, _wrap(api, original, index, name))


def watch_random() -> None:
    """Wrap `random.seed` (the module's own instance; `random.Random(x)` objects are not the
    global RNG)."""
    import random

    _patch(random, "seed", "random.seed", 0, "a")


def watch_numpy(numpy) -> None:
    """Wrap `np.random.seed`, `np.random.default_rng` and `np.random.RandomState`."""
    _OWN.append(os.path.dirname(numpy.__file__) + os.sep)
    nprandom = numpy.random
    _patch(nprandom, "seed", "numpy.random.seed", 0)
    original = nprandom.default_rng
    if not hasattr(original, "__wrapped__"):
        not_seeds = (nprandom.Generator, nprandom.BitGenerator)

        @functools.wraps(original)
        def default_rng(*args, **kwargs):
            value = _argument(args, kwargs, 0, "seed")
            if not isinstance(value, not_seeds):  # wrapping a generator seeds nothing
                _note("numpy.random.default_rng", value, sys._getframe(1))
            return original(*args, **kwargs)

        _watched.add("numpy.random.default_rng")
        nprandom.default_rng = default_rng
    if not getattr(nprandom.RandomState, "_twice_watched", False):
        nprandom.RandomState = _random_state(nprandom.RandomState)


def _random_state(real: type) -> type:
    """A RandomState that records its seed. isinstance and issubclass answer as for the real
    class, so that code checking for a RandomState (scikit-learn's check_random_state) accepts
    NumPy's own instances too; pickles name the real class's constructor."""

    class SameClass(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real)

    class RandomState(real, metaclass=SameClass):
        __doc__ = real.__doc__
        _twice_watched = True

        def __init__(self, seed=None):
            _note("numpy.random.RandomState", seed, sys._getframe(1))
            super().__init__(seed)

    RandomState.__module__ = "numpy.random"
    _watched.add("numpy.random.RandomState")
    return RandomState


def watch_torch(torch) -> None:
    """Wrap `torch.manual_seed`, `torch.seed`, `torch.cuda.manual_seed(_all)`, `torch.cuda.seed
    (_all)` and `torch.Generator.manual_seed`."""
    _OWN.append(os.path.dirname(torch.__file__) + os.sep)
    for module in (torch, torch.random):
        _patch(module, "manual_seed", "torch.manual_seed", 0)
        _patch(module, "seed", "torch.seed", None)
    cuda = getattr(torch, "cuda", None)
    if cuda is not None:
        for attribute, index in (
            ("manual_seed", 0),
            ("manual_seed_all", 0),
            ("seed", None),
            ("seed_all", None),
        ):
            _patch(cuda, attribute, f"torch.cuda.{attribute}", index)
    _watch_generator(torch.Generator)


def _watch_generator(generator: type) -> None:
    """Put a recording `manual_seed` in torch.Generator's own dictionary: the type is immutable
    to setattr, and replacing the class would change `type(g) is torch.Generator` for the
    generators torch makes itself. Where this cannot be done the API is left unwatched."""
    import ctypes
    import gc

    original = generator.__dict__.get("manual_seed")
    if original is None or hasattr(original, "__wrapped__"):
        return
    found = [d for d in gc.get_referents(generator.__dict__) if isinstance(d, dict)]
    if len(found) != 1 or found[0].get("manual_seed") is not original:
        return
    found[0]["manual_seed"] = _wrap("torch.Generator.manual_seed", original, 1)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(generator))  # its method cache


def recorded() -> dict:
    """What the process record keeps: each API and line's calls with the digest of their values
    in order (None: every one seeded from OS entropy), and the APIs watched."""
    return {
        "calls": [
            {
                "api": api,
                "site": site,
                "calls": calls,
                "values": None if values is None else values.hexdigest(),
                "entropy": entropy,
            }
            for (api, site), (calls, values, entropy) in sorted(_calls.items())
        ],
        "watched": sorted(_watched),
    }
