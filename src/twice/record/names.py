"""Parameter names: each parameter named by its path from the outermost module that holds it."""

from __future__ import annotations

import gc
import weakref
from typing import Any

__all__ = [
    "ParamNames",
    "param_names",
    "distinct_names",
    "names_in_words",
    "PARAM_NAMES",
    "process_stream",
]

# optimizer -> (parameter id -> name, parameter id -> (id, class name) of its outermost module)
PARAM_NAMES: weakref.WeakKeyDictionary[Any, tuple[dict[int, str], dict[int, tuple[int, str]]]] = (
    weakref.WeakKeyDictionary()
)


def param_names(optimizer) -> tuple[dict[int, str], dict[int, tuple[int, str]]]:
    """Name each parameter by its path from the outermost module holding it
    ("encoder.layer3.weight").

    One pass over live modules builds a child -> parent map, so naming costs O(modules) rather
    than calling named_parameters() on every submodule.
    """
    import torch

    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    module_type = torch.nn.Module
    # type() rather than isinstance(): isinstance can trigger lazy module attributes' warnings.
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), module_type)]
    parent: dict[int, tuple[Any, str]] = {}
    owner: dict[int, tuple[Any, str]] = {}
    for module in modules:
        for name, child in module._modules.items():
            if child is not None:
                parent.setdefault(id(child), (module, name))
        for name, param in module._parameters.items():
            if param is not None and id(param) in wanted:
                owner.setdefault(id(param), (module, name))
    names, roots = {}, {}
    for key, (module, name) in owner.items():
        parts, seen = [name], set()
        while id(module) in parent and id(module) not in seen:
            seen.add(id(module))
            module, child_name = parent[id(module)]
            parts.append(child_name)
        names[key], roots[key] = ".".join(reversed(parts)), (id(module), type(module).__name__)
    return names, roots


def distinct_names(
    names: dict[int, str], roots: dict[int, tuple[int, str]], order: list[int], taken: set[str]
) -> dict[int, str]:
    """Names from separate outermost modules can coincide (an encoder's and a decoder's "weight",
    or a GAN's two optimizers' models, `taken` holding the names given to the optimizers named
    before): those modules' names are then prefixed with their class ("Embedding.weight",
    "Linear.weight"), numbered in the optimizer's order where classes coincide too
    ("Linear#2.weight")."""
    counts: dict[str, int] = dict.fromkeys(taken, 1)
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    clashing = {roots[key][0] for key, name in names.items() if counts[name] > 1}
    if not clashing:
        return names
    labels: dict[int, str] = {}
    per_class: dict[str, int] = {}
    for key in order:
        if key not in roots or roots[key][0] not in clashing or roots[key][0] in labels:
            continue
        root, cls = roots[key]
        while True:  # not a prefix already given (to another optimizer's module of this class)
            per_class[cls] = per_class.get(cls, 0) + 1
            label = cls if per_class[cls] == 1 else f"{cls}#{per_class[cls]}"
            if not any(name.startswith(label + ".") for name in taken):
                break
        labels[root] = label
    out = {
        key: f"{labels[roots[key][0]]}.{name}" if roots[key][0] in labels else name
        for key, name in names.items()
    }
    used = set(taken)
    for key in order:  # a module could itself be called "Linear": number what still coincides
        if key in out:
            name, n = out[key], 1
            while out[key] in used:
                n += 1
                out[key] = f"{name}#{n}"
            used.add(out[key])
    return out


class ParamNames:
    """The names of each optimizer's parameters in one process, distinct across optimizers; kept
    while the optimizer lives and its parameter count stays (add_param_group changes it).

    Keyed by the optimizer's id and checked against a weak reference to it: an optimizer built
    where a freed one lived (a new model and optimizer per fold, per trial) gets its own
    parameters, never the old one's, and a freed optimizer's parameters are let go."""

    def __init__(self) -> None:
        self._names: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}  # id -> (ref, pairs)
        self._index: dict[int, int] = {}

    def of(self, optimizer) -> list[tuple[str, Any]]:
        """(name, parameter) for each parameter of `optimizer`, in its groups' order."""
        key = id(optimizer)
        groups = optimizer.param_groups
        count = (
            len(groups[0]["params"])
            if len(groups) == 1
            else sum(len(group["params"]) for group in groups)
        )
        cached = self._names.get(key)
        if cached is not None and cached[0]() is optimizer and len(cached[1]) == count:
            return cached[1]
        self._forget_freed()  # (rare: a new optimizer, or its parameter count changed)
        index = self._index.setdefault(key, len(self._index))
        found = PARAM_NAMES.get(optimizer)
        if found is None or len(found[0]) < count:
            found = param_names(optimizer)  # a scan of live objects: once per optimizer and process
            try:
                PARAM_NAMES[optimizer] = found
            except TypeError:
                pass  # an optimizer-like object that takes no weak references
        taken = {
            name for other, (_, named) in self._names.items() if other != key for name, _ in named
        }
        names = distinct_names(
            *found, [id(p) for group in optimizer.param_groups for p in group["params"]], taken
        )
        unnamed = getattr(optimizer, "twice_unnamed", None)  # a hand loop's tensors: "tensor3"
        pairs = [
            (
                names.get(id(param))
                or (f"{unnamed}{p}" if unnamed else f"optimizer{index}.group{g}.param{p}"),
                param,
            )
            for g, group in enumerate(optimizer.param_groups)
            for p, param in enumerate(group["params"])
        ]
        try:
            ref = weakref.ref(optimizer)
        except TypeError:  # no weak references: hold it (it is in use, and rarely many)
            ref = _Strong(optimizer)
        self._names[key] = (ref, pairs)
        return pairs

    def _forget_freed(self) -> None:
        """Drop the entries of optimizers that no longer exist (their ids may be reused)."""
        for key in [
            key for key, (ref, _) in self._names.items() if ref() is None or id(ref()) != key
        ]:
            del self._names[key]
            self._index.pop(key, None)

    def all(self) -> list[tuple[str, Any]]:
        """Every named parameter of every live optimizer seen so far."""
        return [pair for ref, pairs in self._names.values() if ref() is not None for pair in pairs]


class _Strong:
    """A strong reference with weakref.ref's interface."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __call__(self) -> Any:
        return self.value


def names_in_words(names: list[str]) -> str:
    """`a`, `b` and `c` (six at most, then "and N more")."""
    shown = [f"`{name}`" for name in names[:6]]
    if len(names) > 6:
        return ", ".join(shown) + f" and {len(names) - 6} more"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def process_stream(stream: str | None) -> str | None:
    """The trace stream of this process: `stream` (main, rankN), extended for a process that
    multiprocessing started (spawn or forkserver; fork children are named at the fork) by its
    multiprocessing identity, `proc1`, `proc2-1`: the order in which its parent started it, the
    same in two runs of one program."""
    import sys

    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return stream
    identity = getattr(multiprocessing.current_process(), "_identity", ())
    if not identity:
        return stream
    tag = "proc" + "-".join(str(n) for n in identity)
    return f"{stream}.{tag}" if stream else tag
