"""The op table: every aten overload portable mode routes, with its route, its Python function,
its compiled kernels, its fallback and the tests that name it, written to docs/portable-ops.md.

Everything comes from the live routing data: routes.route for each overload of torch's
dispatcher, table.KERNELS for the kernels, ops/recurrent.py for the `torch._VF` layers it
replaces, entrypoints.py for the compiled kernels a kernel's code calls, optests.py for the
tests. `python -m twice.portable.dispatch.optable [PATH]` writes it
(tests/unit/portable/dispatch/test_optable.py fails while the committed file differs).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from twice.portable.dispatch import entrypoints, mode, optests, routes, table
from twice.portable.dispatch.optext import COMMAND, describe, render

__all__ = ["Row", "rows", "entry_point_rows", "overloads", "main", "ROOT", "DOC", "COMMAND"]

ROOT = Path(__file__).resolve().parents[4]
DOC = ROOT / "docs" / "portable-ops.md"
_FAMILIES = {  # a route's section, where it is not a kernel's own module
    routes.FOREACH: "foreach",
    routes.EXACT_ROUTE: "exact",
    routes.INDEX_PUT: "exact",
    routes.OUT: "out",
    routes.DECOMPOSED: "decomposed",
    routes.OTHER: "refused",
}


@dataclass(frozen=True)
class Row:
    """One line of the table: overloads of one packet that share every other column."""

    family: str
    overloads: tuple[str, ...]
    route: str
    function: str
    compiled: str
    fallback: str
    tests: str


@dataclass(frozen=True)
class _Entry:
    family: str
    overload: str
    route: str
    function: str
    compiled: str
    fallback: str
    functions: tuple = ()  # the Python functions a test may name
    packet_wide: bool = True


def overloads() -> list:
    """Every aten overload torch's dispatcher has, and each other namespace's op a kernel takes,
    sorted by name (`routes.overload_name`)."""
    packets = {
        name[len("aten::") :].split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::")
    }
    found = []
    for name in sorted(packets):
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            try:
                found.append(getattr(packet, overload))
            except (AttributeError, RuntimeError):  # listed, but not an operator of its own
                continue
    for key in sorted(k for k in table.KERNELS if "::" in k):  # other namespaces' ops
        namespace, rest = key.split("::")
        packet_name, overload = rest.rsplit(".", 1)
        packet = getattr(getattr(torch.ops, namespace), packet_name, None)  # torch 2.13 and on
        if packet is not None:
            found.append(getattr(packet, overload))
    return sorted(found, key=routes.overload_name)


class _Kernels:
    """The kernels' Python functions and compiled entry points, each walk done once."""

    def __init__(self) -> None:
        from twice.portable import native

        self.setup = entrypoints.setup_entry_points()
        self.triton = {id(native.gpu), id(native.gpu_uniform)}
        self.stops: dict[int, str] = {}
        for name in sorted(table.KERNELS):
            for function in self.chain(table.KERNELS[name]):
                if function.__module__.startswith("twice.portable.ops"):
                    self.stops.setdefault(id(function), name)
        self.done: dict[tuple, entrypoints.Reach] = {}

    @staticmethod
    def chain(function) -> list:
        """The function and every function it wraps, outermost first."""
        found = [function]
        for inner in entrypoints.wrapped(function):
            if callable(inner) and not isinstance(inner, torch._ops.OpOverload):
                found += _Kernels.chain(inner)
        return found

    def direct(self, *functions, skip=()) -> entrypoints.Reach:
        """What the functions' own code reaches, stopping at other ops' kernels: the entry
        points (set-up left out), those ops, and whether a Triton kernel is among them."""
        key = tuple(id(f) for f in (*functions, *skip))
        if key not in self.done:
            own = {id(f) for function in functions for f in self.chain(function)}
            stops = {k: v for k, v in self.stops.items() if k not in own}
            total = entrypoints.Reach()
            for function in functions:
                found = entrypoints.reach(function, skip=(table.KERNELS, *skip), stops=stops)
                total.entry_points |= found.entry_points - self.setup
                total.via |= found.via
                total.entered |= found.entered & self.triton
            self.done[key] = total
        return self.done[key]

    def compiled(self, *functions, skip=()) -> tuple[str, bool]:
        """The compiled-kernel column for the functions, and whether any entry point is in it:
        their own entry points, then those of each other op they run ("through" it)."""
        found = self.direct(*functions, skip=skip)
        triton, anything = bool(found.entered), bool(found.entry_points)
        by_points: dict[tuple, list[str]] = {}
        for op in sorted(found.via):
            other = self.direct(table.KERNELS[op])
            triton, anything = triton or bool(other.entered), anything or bool(other.entry_points)
            by_points.setdefault(tuple(sorted(other.entry_points)), []).append(op)
        parts = [_names(found.entry_points)] if found.entry_points else []
        for points, ops in sorted(by_points.items()):
            if points:  # an op run with torch operations only adds nothing to say
                parts.append(f"{_names(points)} through {_names(ops)}")
        parts += ["Triton on CUDA"] if triton else []
        return "; ".join(parts) or "none (torch operations)", anything


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names))


_FALLBACK = "the same function's torch operations"


def _kernel_entry(name: str, handler, kernels: _Kernels) -> _Entry:
    compiled, anything = kernels.compiled(handler)
    fallback = _FALLBACK if anything else "none needed"
    module = handler.__module__.removeprefix("twice.portable.").replace(".", "/") + ".py"
    function = f"`{describe(handler)}`"
    return _Entry(
        module, name, "kernel", function, compiled, fallback, tuple(kernels.chain(handler))
    )


def _foreach_base(packet: str) -> str:
    """The per-tensor operation a `_foreach_` form runs on each element (mode._foreach)."""
    base = packet[len("_foreach_") :]
    if getattr(torch.ops.aten, base, None) is None and base.endswith("_"):
        return f"{base[:-1]} (written back)"
    return base


def _exact_route(op, complex_too) -> str:
    if routes._is_view(op):
        return "exact: a view, by its schema"
    kind = "table.EXACT" + ("" if complex_too else ", real only (not in table.COMPLEX_EXACT)")
    if op.overloadpacket.__name__.startswith("index_put"):
        kind += "; accumulate=True refused"
    return f"exact: {kind}"


def _entry(op, kernels: _Kernels) -> _Entry | None:
    """The overload's route in the table's words; None where it is uncovered by no rule."""
    try:
        how, handler, name = routes.route(op)
    except RuntimeError:  # not an operator the dispatcher can run
        return None
    family = _FAMILIES.get(how, "")
    if how == routes.KERNEL:
        return _kernel_entry(name, handler, kernels)
    if how == routes.FOREACH:
        base = _foreach_base(op.overloadpacket.__name__)
        runner = f"`{describe(mode.PortableMode._foreach)}`"
        return _Entry(family, name, f"foreach: each element as `{base}`", runner, "—", "—")
    if how in (routes.EXACT_ROUTE, routes.INDEX_PUT):
        return _Entry(family, name, _exact_route(op, handler), "torch's own", "—", "—")
    if how == routes.OUT:
        target = _entry(handler, kernels)
        route = f"out=: `{target.overload}` ({target.route}), copied into `out`"
        return _Entry(
            family, name, route, target.function, target.compiled, target.fallback,
            packet_wide=False,
        )  # fmt: skip
    if how == routes.DECOMPOSED:
        return _Entry(family, name, "decomposed", f"`{describe(handler)}`", "its parts'", "—")
    return _refused(op, name)


def _refused(op, name: str) -> _Entry | None:
    if name in table.NOT_EXACT:
        why = "refused: table.NOT_EXACT (adds in an order)"
    elif torch.Tag.nondeterministic_seeded in op.tags:
        why = "refused: random, with no Philox kernel"
    else:
        return None
    return _Entry("refused", name, why, "—", "—", "torch's kernel under `warn`")


def _recurrent_entries(kernels: _Kernels) -> list[_Entry]:
    """The `torch._VF` layers and cells recurrent.py replaces, one row each (the aten overloads
    of their names run op by op through the mode)."""
    from twice.core.protocol import ChildSettings
    from twice.portable.ops import cells, recurrent

    fields = {f.name: f for f in dataclasses.fields(ChildSettings)}
    switch = fields["no_fused_rnn"].metadata["env"]  # the variable recurrent.install reads
    found = []
    for kind in recurrent._KINDS:  # the torch._VF names recurrent.install replaces
        cell = cells.CELLS[kind]
        compiled, _ = kernels.compiled(recurrent.layers, cell, skip=(cells.CELLS,))
        cell_type = cell if isinstance(cell, type) else type(cell)
        function = f"`{describe(recurrent.layers)}`, `{describe(cell_type)}`"
        fallback = f"op by op: aten `{kind}` decomposed (always with {switch}=1)"
        route = "fused layer where it applies (`torch._VF` replaced while the mode is on)"
        functions = (recurrent.layers, recurrent.RecurrentLayer, cell_type)
        found.append(
            _Entry("ops/recurrent.py", f"torch._VF.{kind}", route, function, compiled, fallback,
                   functions)
        )  # fmt: skip
        compiled, _ = kernels.compiled(recurrent.cell, cell, skip=(cells.CELLS,))
        found.append(
            _Entry("ops/recurrent.py", f"torch._VF.{kind}_cell",
                   "fused step where it applies (`torch._VF` replaced while the mode is on)",
                   f"`{describe(recurrent.cell)}`, `{describe(cell_type)}`", compiled,
                   f"op by op: aten `{kind}_cell` decomposed (always with {switch}=1)",
                   (recurrent.cell, recurrent.RecurrentLayer, cell_type))
        )  # fmt: skip
    return found


def _recurrent_packets() -> set[str]:
    from twice.portable.ops import recurrent

    return {name for kind in recurrent._KINDS for name in (kind, f"{kind}_cell")}


def rows(opinfo: Callable[[], dict[str, list[str]]] = dict, root: Path = ROOT) -> list[Row]:
    """Every row of the table, sorted by family and first overload. `opinfo` gives aten packet
    -> OpInfo names, called once the routes are read (optests.opinfo_names, in a process of its
    own: it changes global flags; the default leaves them out)."""
    kernels = _Kernels()
    entries = [e for op in overloads() if (e := _entry(op, kernels)) is not None]
    recurrent_packets = _recurrent_packets()
    entries = [
        dataclasses.replace(e, family="ops/recurrent.py")
        if e.overload.split(".")[0] in recurrent_packets
        else e
        for e in entries
    ] + _recurrent_entries(kernels)
    tests, opinfo_of = optests.scan_tests(root), opinfo()
    grouped: dict[tuple, list[str]] = {}
    for e in entries:
        packet = e.overload.split(".")[0]
        named = optests.naming_files(tests, e.overload, list(e.functions), e.packet_wide)
        drives = opinfo_of.get(packet, []) if e.packet_wide else []
        key = (e.family, packet, e.route, e.function, e.compiled, e.fallback,
               _tests_text(named, drives))  # fmt: skip
        grouped.setdefault(key, []).append(e.overload)
    found = [Row(k[0], tuple(sorted(v)), *k[2:]) for k, v in grouped.items()]
    return sorted(found, key=lambda r: (r.family, r.overloads))


def _tests_text(files: list[str], infos: list[str]) -> str:
    parts = [", ".join(f"`{f}`" for f in files)] if files else []
    if infos:
        parts.append("OpInfo " + ", ".join(f"`{i}`" for i in infos))
    return "; ".join(parts) or "—"


def entry_point_rows() -> list[tuple[str, str, str]]:
    """(entry point, the C file that binds it, the native/ functions that call it), sorted."""
    import twice

    defined = entrypoints.definitions(Path(twice.__file__).parent)
    calls = entrypoints.callers()
    return [
        (name, defined.get(name, "not bound by any C file"), ", ".join(calls.get(name, ())))
        for name in sorted(set(defined) | set(calls))
    ]


def main(argv: list[str] | None = None) -> int:
    """Write the table to PATH (docs/portable-ops.md by default)."""
    from twice.core.errors import UsageError
    from twice.store.files import write_bytes_atomic

    args = sys.argv[1:] if argv is None else argv
    if not (ROOT / "tests").is_dir():
        raise UsageError(
            f"no tests folder at {ROOT}: the op table is made in twice's source tree",
            hint="run it from a checkout of twice installed with `pip install -e .`",
        )
    text = render(rows(optests.opinfo_names), entry_point_rows())
    write_bytes_atomic(Path(args[0]) if args else DOC, text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
