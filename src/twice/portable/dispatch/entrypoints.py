"""Which compiled entry points (`twice._native`'s `p_*` functions) a portable kernel calls, read
from the bytecode of the kernel and of every portable function, class and table it names.

The op table (optable.py) takes its "compiled kernel" column from here, so a kernel added or
moved needs no annotation: what its code calls is what the table says. The walk follows a
function's globals, its closure (the kernel a wrapper such as `unary(...)` or `_guard(...)`
wraps), the functions it imports inside its body, a table looked up with a constant key
(`KERNELS["tanh_backward.default"]`), every value of a table looked up otherwise (`CELLS[kind]`)
and every method of a class it names. An entry point is an attribute or a string constant
spelled `p_<name>`: `_module.p_split(...)`, `module.p_conv_forward(...)`, `_kernels("p_unfold")`.

Two things keep the answer to what a call can run, not more: a branch on a wrapper's closure
constant is folded (`unary(sin)` has no compiled name, so its `native.unary` call is dead), and
the walk stops at another op's kernel (`stops`), naming that op instead of taking in its kernels
(the transposed convolution's forward runs the ordinary convolution's backward).
"""

from __future__ import annotations

import dis
import re
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Reach", "reach", "setup_entry_points", "wrapped", "definitions", "callers"]

_ENTRY = re.compile(r"p_[a-z0-9_]+\Z")
_DEFINED = re.compile(r'\{\s*"(p_[a-z0-9_]+)"')  # an entry of a C file's PyMethodDef table
_NOTHING = object()  # an instruction's value the walk cannot name
_FOLDABLE = (type(None), bool, int, str)  # closure constants whose truth a branch may test


class _Const:
    """A constant the bytecode loads: a key for the table lookup that may follow."""

    def __init__(self, value) -> None:
        self.value = value


@dataclass
class Reach:
    """What a walk found: the entry points, the other ops' kernels it stopped at, and the ids of
    the functions it entered."""

    entry_points: set[str] = field(default_factory=set)
    via: set[str] = field(default_factory=set)
    entered: set[int] = field(default_factory=set)


def _module_of(value) -> str:
    module = getattr(value, "__module__", None)
    return module if isinstance(module, str) else ""


class _Walk:
    """One walk: the objects seen, what it found, what not to enter, where to stop."""

    def __init__(self, within: tuple[str, ...], skip: Iterable, stops: dict[int, str]) -> None:
        self.within = within
        self.skip = {id(s) for s in skip}
        self.stops = stops
        self.seen: set[int] = set()
        self.found = Reach()

    def ours(self, value) -> bool:
        return _module_of(value).startswith(self.within)

    def visit(self, value) -> None:
        """Enter a function, class, instance or table of ours, once."""
        if isinstance(value, (_Const, types.ModuleType)) or id(value) in self.seen:
            return
        if id(value) in self.skip:
            return
        if id(value) in self.stops:
            self.found.via.add(self.stops[id(value)])
            return
        self.seen.add(id(value))
        if isinstance(value, (staticmethod, classmethod, types.MethodType)):
            self.visit(value.__func__)
        elif isinstance(value, property):
            for part in (value.fget, value.fset, value.fdel):
                self.visit(part)
        elif isinstance(value, types.FunctionType):
            if self.ours(value):
                self._function(value)
        elif isinstance(value, dict):
            for item in value.values():
                self.visit(item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                self.visit(item)
        elif isinstance(value, type):
            if self.ours(value):
                for item in vars(value).values():
                    self.visit(item)
        elif self.ours(type(value)):
            self.visit(type(value))  # an instance of a class of ours (a cell in CELLS)

    def _function(self, function: types.FunctionType) -> None:
        self.found.entered.add(id(function))
        closure = {}
        for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
            try:
                closure[name] = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
        self._code(function.__code__, function.__globals__, closure)

    def _code(self, code: types.CodeType, globals_: dict, closure: dict) -> None:
        """Follow one code object's loads, attributes, imports and constant lookups."""
        instructions = list(dis.get_instructions(code))
        dead = _dead(instructions, closure)
        names: dict[str, object] = {}  # locals bound to something the walk can name
        last = [_NOTHING, _NOTHING]  # the values of the two instructions before
        for ins in instructions:
            if any(start <= ins.offset < end for start, end in dead):
                continue
            value = self._value(ins, last, globals_, closure, names)
            self.visit(value)
            last = [last[1], value]

    def _value(self, ins, last, globals_, closure, names):
        """What the instruction puts on the stack, where the walk can name it."""
        op, arg = ins.opname, ins.argval
        if op in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM") and isinstance(arg, str):
            if _ENTRY.match(arg):
                self.found.entry_points.add(arg)
            holder = last[1]
            if isinstance(holder, (types.ModuleType, type)):
                return getattr(holder, arg, _NOTHING)
            return _NOTHING
        if op == "LOAD_CONST":
            if isinstance(arg, str) and _ENTRY.match(arg):
                self.found.entry_points.add(arg)
            if isinstance(arg, types.CodeType):  # a lambda or an inner function
                self._code(arg, globals_, {})
            return _Const(arg)
        if op == "IMPORT_NAME":
            return sys.modules.get(arg, _NOTHING) if isinstance(arg, str) else _NOTHING
        if op == "BINARY_SUBSCR" or (op == "BINARY_OP" and ins.argrepr == "[]"):
            table, key = last
            if isinstance(table, dict) and isinstance(key, _Const) and key.value.__hash__:
                return table.get(key.value, _NOTHING)
            return _NOTHING
        if op == "STORE_FAST":
            names[arg] = last[1]
            return _NOTHING
        if op in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
            return closure.get(arg, _NOTHING)
        if op.startswith("LOAD_FAST") and isinstance(arg, str):  # _CHECK, _BORROW: 3.12+
            value = names.get(arg, _NOTHING)
            return _NOTHING if isinstance(value, _Const) else value
        if op in ("LOAD_GLOBAL", "LOAD_NAME"):
            return globals_.get(arg, _NOTHING)
        return _NOTHING


def _dead(instructions: list, closure: dict) -> list[tuple[int, int]]:
    """The offsets a forward branch on a closure constant always jumps over: `if name is not
    None and ...` where the wrapper was made with name=None."""
    dead = []
    for i, ins in enumerate(instructions):
        if not ins.opname.startswith("POP_JUMP") or "BACKWARD" in ins.opname:
            continue
        test = _tested(instructions[max(0, i - 3) : i], closure)
        if test is _NOTHING or ins.argval <= ins.offset:
            continue
        kind = ins.opname.rsplit("_IF_", 1)[-1]
        jumps = {"NONE": test is None, "NOT_NONE": test is not None}.get(kind)
        if jumps is None:
            jumps = bool(test) if kind == "TRUE" else not bool(test)
        if jumps:
            dead.append((instructions[i + 1].offset, ins.argval))
    return dead


def _tested(before: list, closure: dict):
    """The value a conditional jump tests, where it is a closure constant (alone, or compared
    with None by `is`/`is not`); _NOTHING otherwise."""
    ops = [(ins.opname, ins.argval) for ins in before]
    if ops and ops[-1][0] == "LOAD_DEREF":
        value = closure.get(ops[-1][1], _NOTHING)
        return value if isinstance(value, _FOLDABLE) else _NOTHING
    if len(ops) == 3 and ops[0][0] == "LOAD_DEREF" and ops[1] == ("LOAD_CONST", None):
        value = closure.get(ops[0][1], _NOTHING)
        if ops[2][0] == "IS_OP" and isinstance(value, _FOLDABLE):
            return (value is None) != bool(ops[2][1])  # IS_OP 1 is `is not`
    return _NOTHING


def reach(
    function: Callable,
    *,
    within: tuple[str, ...] = ("twice.portable",),
    skip: Iterable = (),
    stops: dict[int, str] | None = None,
) -> Reach:
    """Every `p_*` name the function's code, or code it can reach, calls or names. Only
    objects of modules under `within` are entered; `skip` names objects the walk leaves out
    (the registry of kernels, a table of cells); `stops` maps the id of another op's kernel to
    that op's name, where the walk stops and notes the name."""
    walk = _Walk(within, skip, stops or {})
    walk.visit(function)
    return walk.found


def setup_entry_points() -> frozenset[str]:
    """The entry points every kernel's applicability check reaches (`native.usable`: the
    coefficients' one-time hand-over, the thread count): set-up, not a kernel's arithmetic."""
    from twice.portable import native

    return frozenset(reach(native.usable).entry_points)


def wrapped(function) -> list:
    """The functions and aten overloads a wrapper made by a factory (`unary(ew.exp)`,
    `_guard(conv.convolution)`) closes over, in its closure's order; [] for a plain function."""
    if not isinstance(function, types.FunctionType) or "<locals>" not in function.__qualname__:
        return []
    found = []
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, types.FunctionType) or type(value).__name__ == "OpOverload":
            found.append(value)
    return found


def definitions(package: Path) -> dict[str, str]:
    """Entry point -> the C file (relative to `package`, twice's folder) whose method table
    binds it."""
    from twice.store import reader

    found = {}
    for path in sorted(package.rglob("*.c")):
        for name in _DEFINED.findall(reader.read_input(path).decode()):
            found.setdefault(name, path.relative_to(package).as_posix())
    return found


def callers() -> dict[str, list[str]]:
    """Entry point -> the functions of portable/native/ whose own code names it ("conv.forward",
    "rnn.Steps.step"), the Python side of each compiled kernel."""
    import twice.portable.native as native

    found: dict[str, set[str]] = {}
    for module in (native, *_submodules(native)):
        prefix = module.__name__.removeprefix("twice.portable.")
        for function in _functions(module):
            walk = _Walk((), (), {})  # enters nothing: this function's own code only
            walk._function(function)
            for point in walk.found.entry_points:
                found.setdefault(point, set()).add(f"{prefix}.{function.__qualname__}")
    return {point: sorted(labels) for point, labels in found.items()}


def _submodules(package) -> list:
    """The package's modules that import here (native/triton.py needs Triton: a CPU build of
    torch has none, and it calls no C entry point)."""
    import importlib
    import pkgutil

    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        try:
            found.append(importlib.import_module(f"{package.__name__}.{info.name}"))
        except ImportError:
            continue
    return found


def _functions(module) -> list:
    """The functions a module defines, and its classes' methods."""
    found = []
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, types.FunctionType):
            found.append(value)
        elif isinstance(value, type):
            found += [v for v in vars(value).values() if isinstance(v, types.FunctionType)]
    return found
