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


# The APIs that seed an RNG every part of the process draws from. The others seed an RNG object,
# and one a package makes as it is imported (sympy's `random.Random()` for its names) is its own.
_GLOBAL = {"random.seed", "numpy.random.seed", "torch.default_generator.manual_seed"}
_GLOBAL.update({"torch.default_generator.seed", "torch.manual_seed", "torch.seed"})


def _importing(frame) -> bool:
    """Whether `frame` runs while its module is being imported (importlib marks its spec)."""
    module = sys.modules.get(frame.f_globals.get("__name__", ""))
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _site(frame, api: str) -> str | None:
    """`file:line` of the script's call, or None where the seeding is twice's or a library's own:
    a call from an installed package is placed at the user's line that called into it, unless
    the package seeds an RNG object of its own while it is imported."""
    if _kind(frame.f_code) in ("twice", "library"):
        return None
    own = not api.startswith("torch.cuda.") and api not in _GLOBAL
    caller = frame
    while caller is not None and _kind(caller.f_code) != "user":
        if own and _importing(caller):
            return None
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
    site = _site(frame, api)
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
    """Wrap `random.seed` (the module's own instance) and `random.Random.seed` in the class, which
    `Random(x)` calls as it is made: every instance's seeding is recorded, `random.Random` where
    the constructor seeded it."""
    import random

    _patch(random, "seed", "random.seed", 0, "a")  # a bound method of the original: not twice
    original = random.Random.__dict__.get("seed")
    if original is None or hasattr(original, "__wrapped__"):
        return
    constructor = random.Random.__init__.__code__

    @functools.wraps(original)
    def seed(self, a=None, *args, **kwargs):
        frame, api = sys._getframe(1), "random.Random.seed"
        if frame.f_code is constructor:  # the line that made the instance seeded it
            frame, api = frame.f_back, "random.Random"
        if frame is not None:
            _note(api, a, frame)
        return original(self, a, *args, **kwargs)

    _watched.update(("random.Random", "random.Random.seed"))
    random.Random.seed = seed


def watch_numpy(numpy) -> None:
    """Wrap `np.random.seed`, `np.random.default_rng` and `np.random.RandomState`."""
    _OWN.append(os.path.dirname(numpy.__file__) + os.sep)
    nprandom = numpy.random
    _patch(nprandom, "seed", "numpy.random.seed", 0)
    original = nprandom.default_rng
    if not hasattr(original, "__wrapped__"):
        not_seeds = (nprandom.Generator, nprandom.BitGenerator, nprandom.SeedSequence)

        @functools.wraps(original)
        def default_rng(*args, **kwargs):
            value = _argument(args, kwargs, 0, "seed")
            if not isinstance(value, not_seeds):  # wrapping a generator seeds nothing
                _note("numpy.random.default_rng", value, sys._getframe(1))
            return original(*args, **kwargs)

        _watched.add("numpy.random.default_rng")
        nprandom.default_rng = default_rng
    # Cython classes, immutable: the names in the module are replaced with recording subclasses.
    # `Generator(bit_generator)` seeds nothing; NumPy's own code keeps the real classes.
    made = (nprandom.Generator, nprandom.BitGenerator, nprandom.SeedSequence)
    for name in ("RandomState", "SeedSequence", "PCG64", "PCG64DXSM", "Philox", "MT19937", "SFC64"):
        real = getattr(nprandom, name, None)
        if real is not None and not getattr(real, "_twice_watched", False):
            setattr(nprandom, name, _seeded_class(real, f"numpy.random.{name}", made))


def _seeded_class(real: type, api: str, made: tuple) -> type:
    """`real` recording the seed it is made with (its first argument, `seed` or `entropy`;
    Philox's `key`): not where that is a generator, a bit generator or a seed sequence, recorded
    where it was made, nor for a SeedSequence's spawned children (NumPy's `spawn` makes them from
    their parent's entropy). isinstance and issubclass answer as for the real class, so that code
    checking for a RandomState (scikit-learn's check_random_state) accepts NumPy's own instances
    too; pickles name the real class's constructor."""

    class SameClass(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real)

    class Seeded(real, metaclass=SameClass):
        __doc__ = real.__doc__
        _twice_watched = True

        def __init__(self, *args, **kwargs):
            value = args[0] if args else kwargs.get("seed", kwargs.get("entropy"))
            if value is None:
                value = kwargs.get("key")
            if not isinstance(value, made) and not kwargs.get("spawn_key"):
                _note(api, value, sys._getframe(1))
            super().__init__(*args, **kwargs)

    Seeded.__name__ = Seeded.__qualname__ = real.__name__
    Seeded.__module__ = "numpy.random"
    _watched.add(api)
    return Seeded


def watch_torch(torch) -> None:
    """Wrap `torch.manual_seed`, `torch.seed`, `torch.cuda.manual_seed(_all)`, `torch.cuda.seed
    (_all)`, and `torch.Generator`'s `manual_seed` and `seed` (OS entropy), those of
    `torch.default_generator` named as such."""
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
    for method, index in (("manual_seed", 1), ("seed", None)):
        _watch_generator(torch.Generator, method, index, torch.default_generator)


def _watch_generator(generator: type, method: str, index: int | None, default) -> None:
    """Put a recording `method` in torch.Generator's own dictionary: the type is immutable to
    setattr, and replacing the class would change `type(g) is torch.Generator` for the
    generators torch makes itself. Where this cannot be done the API is left unwatched."""
    import ctypes
    import gc

    original = generator.__dict__.get(method)
    if original is None or hasattr(original, "__wrapped__"):
        return
    found = [d for d in gc.get_referents(generator.__dict__) if isinstance(d, dict)]
    if len(found) != 1 or found[0].get(method) is not original:
        return
    apis = (f"torch.Generator.{method}", f"torch.default_generator.{method}")

    @functools.wraps(original)
    def seeding(self, *args, **kwargs):
        value = None if index is None else _argument((self, *args), kwargs, index, "seed")
        _note(apis[self is default], value, sys._getframe(1))
        return original(self, *args, **kwargs)

    _watched.update(apis)
    found[0][method] = seeding
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(generator))  # its method cache


# A forked child (a DataLoader worker) records its own calls: its parent's are its parent's.
os.register_at_fork(after_in_child=_calls.clear)


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
