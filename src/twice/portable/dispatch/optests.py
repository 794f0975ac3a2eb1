"""Which tests name an aten overload or its portable kernel: the op table's "tests" column, read
from the test sources and PyTorch's OpInfo list, never from a hand list.

A test file counts when it imports twice.portable (and is not the op table's own) and names the op
in one of four ways: an aten attribute (`torch.ops.aten.convolution_backward`), an overload's name
as a string (`"mm.default"`, `"aten::_fft_r2c"`), the kernel's Python function through its module
(`pconv.convolution_backward`, `recurrent.layers`), or a call of the op's name inside a `with
PortableMode(...)` block (`torch.exp(x)`, `x.sum()`, `F.gelu(x)`). The OpInfo coverage test
(tests/e2e/test_portable_coverage.py) drives every OpInfo that supports float32 on the CPU; an op
is listed under the OpInfos whose `aten_name` (or `aten_backward_name`) it is.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from pathlib import Path

from twice.store import reader

__all__ = ["TestFile", "scan_tests", "opinfo_names", "naming_files"]

_MODE_NAMES = ("PortableMode",)
# The op table's own tests name ops as entries of the table, not to test them.
_TABLE_MODULES = ("twice.portable.dispatch.opt", "twice.portable.dispatch.entrypoints")


@dataclass
class TestFile:
    """What one test file names: aten attributes, overload strings, objects of twice's reached
    through their module, and the calls made under portable mode."""

    path: str
    aten: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)
    objects: set[int] = field(default_factory=set)
    under_mode: set[str] = field(default_factory=set)


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> the twice module (or object path) it stands for."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("twice"):
                    found[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("twice"):
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _resolve(path: str):
    """The object of portable mode's a dotted path names (a module, or an attribute of one), or
    None."""
    if not path.startswith("twice.portable"):
        return None
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name, None)
        return value
    return None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _under_mode(tree: ast.AST) -> set[str]:
    """The names called inside `with PortableMode(...)` blocks."""
    called = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.With):
            continue
        entered = [item.context_expr for item in node.items]
        if not any(
            isinstance(e, ast.Call) and (_dotted(e.func) or "").endswith(_MODE_NAMES)
            for e in entered
        ):
            continue
        for inner in ast.walk(ast.Module(body=node.body, type_ignores=[])):
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                called.add(inner.func.attr)
            elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
                called.add(inner.func.id)
    return called


def _scan_file(path: Path, root: Path) -> TestFile | None:
    tree = ast.parse(reader.read_input(path).decode())
    imported = _imports(tree)
    targets = imported.values()
    if not any(t.startswith("twice.portable") for t in targets) or any(
        t.startswith(_TABLE_MODULES) for t in targets
    ):
        return None
    found = TestFile(path.relative_to(root).as_posix())
    found.under_mode = _under_mode(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            holder = _dotted(node.value)
            if holder is not None and holder.split(".")[-1] == "aten":
                found.aten.add(node.attr)
            if isinstance(node.value, ast.Name) and node.value.id in imported:
                value = _resolve(f"{imported[node.value.id]}.{node.attr}")
                if value is not None:
                    found.objects.add(id(value))
        elif isinstance(node, ast.Name) and node.id in imported:
            value = _resolve(imported[node.id])
            if value is not None:
                found.objects.add(id(value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.removeprefix("aten::")
            if "." in text or text != node.value:
                found.strings.add(text)
    return found


def scan_tests(root: Path) -> list[TestFile]:
    """Every test file under root/tests that imports twice.portable (the op table's own tests
    aside), with what it names."""
    files = sorted((root / "tests").rglob("*.py"))
    return [found for path in files if (found := _scan_file(path, root / "tests")) is not None]


def naming_files(
    tests: list[TestFile], overload: str, functions: list, packet_wide: bool
) -> list[str]:
    """The test files that name `overload` ("mm.default"), or one of its kernel's `functions`;
    `packet_wide`: an aten attribute or a call of the packet's name counts too (not for an
    out= form, which no call names)."""
    packet = overload.split(".")[0]
    ids = {id(f) for f in functions}
    named = []
    for found in tests:
        if (
            overload in found.strings
            or (overload.endswith(".default") and packet in found.strings)
            or (ids & found.objects)
            or (packet_wide and (packet in found.aten or packet in found.under_mode))
        ):
            named.append(found.path)
    return named


def opinfo_names() -> dict[str, list[str]]:
    """aten packet -> the OpInfos (of those the coverage test draws from: float32 on the CPU,
    no jiterator) whose aten_name or aten_backward_name it is. Importing PyTorch's op_db turns
    off torch.backends' global flags for the whole process: call it only in a process of its
    own (the op table's command)."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    names: dict[str, set[str]] = {}
    for info in op_db:
        if info.name.startswith("jiterator") or torch.float32 not in info.supported_dtypes("cpu"):
            continue
        label = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        for aten in (info.aten_name, info.aten_backward_name):
            if aten:
                names.setdefault(aten, set()).add(label)
    return {aten: sorted(labels) for aten, labels in names.items()}
