"""The read door: every file twice reads goes through store/reader.py (whose refusal of every
hostile form of a file is tests/unit/store/test_reader.py).

The scan below fails when a new module reads a file around the door."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import twice

PACKAGE = Path(twice.__file__).parent
DOOR = "store/reader.py"

# Reading calls, by the module they are called on: json.load(s), pickle, np.load, torch.load...
READ_MODULES = {"json", "pickle", "marshal", "np", "numpy", "torch", "yaml", "orjson", "tomllib",
                "safetensors", "safetensors.torch", "io"}  # fmt: skip
READ_NAMES = {"load", "loads", "fromfile", "memmap", "Unpickler", "safe_open", "load_file",
              "loadtxt", "genfromtxt", "from_file", "FileIO"}  # fmt: skip
# Path methods that read, and builtins that open.
READ_METHODS = {"read_text", "read_bytes"}
WRITE_MODES = ("w", "a", "x")

# The few places that may do what the door forbids, each with its reason. The list is closed:
# test_every_exception_is_still_needed fails when an entry no longer matches the code.
EXCEPTIONS = {
    ("store/dcpmeta.py", "import pickle"): "the restricted unpickler: the one reader of DCP's "
    "pickled metadata, resolving only DCP's record classes, fed bytes read by the door",
    (
        "store/tracescan.py",
        "from orjson import loads",
    ): "a trace line the compiled validator already held "
    "canonical and valid: parsed fast, never a new language",
    ("checkpoint/sharded.py", "torch.load"): "DCP's own bytes entries, read by the door, decoded "
    "with weights_only=True (tensors and plain values only)",
    ("store/files.py", "os.open to read"): "fsync_dir opens a folder to sync a rename, reading "
    "nothing",
    ("store/traces.py", "os.open to write"): "the trace writer (O_WRONLY | O_APPEND)",
    ("app/trust.py", "os.open to write"): "the key is created with O_CREAT | O_EXCL, mode 0600",
}


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = func.value
        if isinstance(base, ast.Name):
            return f"{base.id}.{func.attr}"
        return f"?.{func.attr}"
    return None


def _mode(node: ast.Call, position: int) -> str | None:
    if len(node.args) > position and isinstance(node.args[position], ast.Constant):
        return node.args[position].value
    for keyword in node.keywords:
        if keyword.arg == "mode" and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return None


def door_violations(source: str) -> list[tuple[int, str]]:
    """(line, what) of every read in `source` that goes around the door."""
    found = []
    tree = ast.parse(source)
    assignments = {
        node.targets[0].id: ast.unparse(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            for name in names:
                if name.split(".")[0] in ("pickle", "marshal", "shelve", "dill", "cloudpickle"):
                    found.append((node.lineno, f"import {name}"))
            if isinstance(node, ast.ImportFrom) and (node.module or "") in READ_MODULES | {
                m.split(".")[0] for m in READ_MODULES
            }:
                for alias in node.names:
                    if alias.name in READ_NAMES:
                        found.append((node.lineno, f"from {node.module} import {alias.name}"))
            continue
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        if name is None:
            continue
        base, _, attr = name.rpartition(".")
        if name == "open" or name in ("io.open", "codecs.open"):
            mode = _mode(node, 1)
            if not (isinstance(mode, str) and any(m in mode for m in WRITE_MODES)):
                found.append((node.lineno, f"{name}() to read"))
        elif attr == "open" and base not in ("os", "self", "live", "tarfile", "zipfile"):
            mode = _mode(node, 0)  # Path.open(mode); no mode at all reads
            if not (isinstance(mode, str) and any(m in mode for m in WRITE_MODES)):
                found.append((node.lineno, f"{name}() to read"))
        elif name == "os.open":
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            for assigned, value in assignments.items():  # flags held in a local name
                flags = re.sub(rf"\b{assigned}\b", value, flags)
            writes = "O_WRONLY" in flags or "O_RDWR" in flags or "O_CREAT" in flags
            found.append((node.lineno, "os.open to write" if writes else "os.open to read"))
        elif attr in READ_METHODS:
            found.append((node.lineno, f".{attr}()"))
        elif base in READ_MODULES and attr in READ_NAMES:
            found.append((node.lineno, name))
        elif attr == "Unpickler" or name in ("pickle.load", "pickle.loads"):
            found.append((node.lineno, name))
    return found


def _sources() -> dict[str, str]:
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _unexcused() -> list[str]:
    bad = []
    for module, source in _sources().items():
        if module == DOOR:
            continue
        for line, what in door_violations(source):
            key = (module, what.removesuffix("() to read"))
            if key in EXCEPTIONS or (module, what) in EXCEPTIONS:
                continue
            bad.append(f"{module}:{line}: {what}")
    return bad


def test_no_module_reads_a_file_around_the_door():
    bad = _unexcused()
    assert not bad, (
        "read through twice.store.reader (read_json, read_record, read_tail, open_input, ...), "
        "or list the exception with its reason:\n" + "\n".join(bad)
    )


def test_every_exception_is_still_needed():
    sources = _sources()
    for module, what in EXCEPTIONS:
        found = {w.removesuffix("() to read") for _, w in door_violations(sources[module])}
        assert what in found, f"{module} no longer does {what}: drop it from EXCEPTIONS"


@pytest.mark.parametrize(
    "source",
    [
        "import json\njson.loads(x)\n",
        "import json\njson.load(f)\n",
        "from json import loads\n",
        "open(p)\n",
        "open(p, 'rb')\n",
        "Path(p).read_text()\n",
        "p.read_bytes()\n",
        "p.open('rb')\n",
        "import pickle\n",
        "import numpy as np\nnp.load(p)\n",
        "import torch\ntorch.load(p)\n",
        "os.open(p, os.O_RDONLY)\n",
        "flags = os.O_RDONLY | os.O_NOFOLLOW\nos.open(p, flags)\n",
        "from safetensors.torch import load_file\n",
        "Path(p).open()\n",
        "import io\nio.FileIO(p)\n",
        "import numpy as np\nnp.loadtxt(p)\n",
        "import torch\ntorch.from_file(p)\n",
    ],
)
def test_the_scan_sees_every_way_of_reading(source):
    assert door_violations(source), source


@pytest.mark.parametrize(
    "source",
    [
        "open(p, 'wb')\n",
        "open(p, 'a')\n",
        "p.open('w')\n",
    ],
)
def test_the_scan_lets_writes_pass(source):
    assert not door_violations(source)


def test_an_os_open_is_told_a_read_or_a_write_by_its_flags_wherever_they_are_held():
    held = "flags = os.O_WRONLY | os.O_APPEND\nos.open(p, flags)\n"
    assert [w for _, w in door_violations(held)] == ["os.open to write"]
    assert [w for _, w in door_violations("os.open(p, os.O_RDONLY)\n")] == ["os.open to read"]
