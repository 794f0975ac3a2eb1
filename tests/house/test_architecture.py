"""The house's rules, checked on the source: layered folders, imports pointing down, no cycles, a
pure core.

Every import form is scanned (`import twice.x`, `from twice.x import y`, `from twice import x`,
relative imports), at module level and inside functions, in every file of the package, `_boot/`
included. docs/ARCHITECTURE.md explains the layers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import twice

PACKAGE = Path(twice.__file__).parent

# Folders, lowest first: a module may import from its own folder or a lower one, never a higher one.
LAYERS = [
    "core",
    "rng",
    "store",
    "checkpoint",
    "record",
    "portable",
    "data",
    "runtime",
    "app",
    "integrations",
]
# Files directly in twice/: the compiled module sits below everything; the command line (cli/), the
# public facades (twice.testing, twice.numerics, twice.parallel) and `python -m twice` above
# everything.
TOP_LEVEL = {
    "_native": -1,
    "_fold_kernel": -1,  # the device fold as a Triton kernel: heavy, so outside the pure core
    "_process": -1,  # tensor memory and the environment, read for the core (which reads neither)
    "cli": len(LAYERS),
    "__main__": len(LAYERS),
    "testing": len(LAYERS),
    "pytest_plugin": -1,  # imports nothing of twice's (pytest loads it in every session)
    "numerics": len(LAYERS),
    "parallel": len(LAYERS),
    "__init__": len(LAYERS),
}
MAX_LINES = 400
# Modules still longer than MAX_LINES, each held at its size when listed, with what it holds. Not
# a licence: the list may only shrink (test_long_modules_are_still_long fails once one is split,
# so it leaves the list) and a listed module may not grow.
LONG_MODULES: dict[str, tuple[int, str]] = {
    "twice.core.digests": (
        457,
        "one concept: the Digester, and digests of single values and tensors",
    ),
    "twice.rng.sample": (423, "one concept: a sample's RNG states, made in place by its Seeder"),
}
# Where file names are spelled: the run folder's in store/layout.py; a checkpoint folder's, a
# sweep folder's and the user's cache of input digests each in the one module that owns it.
FILE_NAME_HOMES = {
    "twice.store.layout",
    "twice.checkpoint.index",
    "twice.store.sweeps",
    "twice.store.inputs",
    # DCP's own names (`.metadata`, `*.distcp`): the reader of its format, below checkpoint/, which
    # recognises a DCP save among any command's outputs too (checkpoint/index.py names them
    # from it)
    "twice.store.dcpmeta",
}
# A file name (`trace.jsonl`), DCP's (`.metadata`, `*.distcp`: in a pattern too, not in a dotted
# module name), or a checkpoint's or rank part's folder (`step-{n:08d}`'s "step-", `^step-(\d+)$`);
# a string with spaces in it is prose.
FILE_NAME = re.compile(
    r"^[^\s]*\.(jsonl|json|log|patch|safetensors|distcp)$"
    r"|^\^?(step|rank)-"
    r"|^(?=\S*$)(.*[^\w.\\])?\\?\.(metadata|distcp)\b"
)
# The run folder's subfolders: joined to a path only in store/layout.py.
RUN_SUBFOLDERS = {"ops", "procs", "checkpoints"}
FILE_CALLS = {
    "open",
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "mkdir",
    "unlink",
    "rmdir",
    "iterdir",
    "glob",
    "rglob",
    "replace",
    "rename",
    "fsync",
    "makedirs",
    "remove",
    "listdir",
    "scandir",
}
# Not imported by the core at module level: processes and files, and every heavy library.
IMPURE_MODULES = {
    "subprocess", "shutil", "tempfile", "socket", "pathlib", "torch", "numpy", "triton", "scipy",
    "matplotlib", "safetensors", "click", "rich",
}  # fmt: skip


def _modules() -> dict[str, Path]:
    """Every Python file of the package by dotted name ("twice.core.digests")."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The package module a dotted name refers to (a name imported from a module resolves to the
    module)."""
    while name and name not in MODULES and name != "twice._native":
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, *, top_level_only: bool = False) -> set[str]:
    """The twice modules `module` imports, by every import form."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    # module-level NAME = "twice.x": a module's name held in a constant is looked up all the same
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }

    def literal(expr: ast.AST | None) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        return constants.get(expr.id) if isinstance(expr, ast.Name) else None

    found: set[str] = set()
    for node in nodes:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
        ):  # import_module("twice.x"), __import__("twice.x"): an import all the same
            targets = [literal(node.args[0]) or ""]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_sys_modules(node.func.value)
            and node.args
        ):  # sys.modules.get("twice.x"): the module used, where something else loaded it
            targets = [literal(node.args[0]) or ""]
        elif isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
            targets = [literal(node.slice) or ""]  # sys.modules["twice.x"]
        elif isinstance(node, ast.Compare) and any(map(_is_sys_modules, node.comparators)):
            targets = [literal(node.left) or ""]  # "twice.x" in sys.modules
        for target in targets:
            if target == "twice" or not target.startswith("twice."):
                continue
            resolved = _resolve(target)
            if resolved and resolved != module:
                found.add(resolved)
    # "from twice.x import y" also names twice.x; keep the most specific module per statement
    return {m for m in found if not any(other.startswith(m + ".") for other in found)} | (
        {m for m in found if m == "twice._native"}
    )


def _is_sys_modules(expr: ast.AST) -> bool:
    return (
        isinstance(expr, ast.Attribute)
        and expr.attr == "modules"
        and isinstance(expr.value, ast.Name)
        and expr.value.id == "sys"
    )


def _layer(module: str) -> int:
    name = module.split(".")[1]
    return LAYERS.index(name) if name in LAYERS else TOP_LEVEL[name]


def test_every_module_has_a_place():
    for module in MODULES:
        parts = module.split(".")
        if len(parts) == 1:
            continue
        # a layer's folder, or a top-level module (the command line is a package of its own)
        assert parts[1] in LAYERS or (
            parts[1] in TOP_LEVEL and (len(parts) == 2 or parts[1] == "cli")
        ), f"{module}: put it in one of the layers {LAYERS}, or list it in TOP_LEVEL"


def test_the_scanner_sees_every_import_form(tmp_path):
    source = (
        "import twice.core.digests\nfrom twice.store import traces\nfrom twice import _native\n"
        "def f():\n    from ..core import seeds\n    from .records import StepRecord\n"
        "    importlib.import_module('twice.core.manifest')\n"
        "    __import__('twice.core.steps')\n"
        "    sys.modules.get('twice.core.stats')\n    sys.modules['twice.core.opdiff']\n"
        "    'twice.core.causes' in sys.modules\n    sys.modules.get(_HELD)\n"
        "_HELD = 'twice.core.coverage'\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = _imports("twice.core.probe", path)
    assert {
        "twice.core.digests",
        "twice.store.traces",
        "twice._native",
        "twice.core.records",
        "twice.core.manifest",
        "twice.core.steps",
        "twice.core.stats",
        "twice.core.opdiff",
        "twice.core.causes",
        "twice.core.coverage",
    } <= found
    assert _imports("twice.store.probe", path) >= {"twice.core.seeds"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.count(".") >= 1))
def test_imports_point_down(module):
    for imported in _imports(module, MODULES[module]):
        assert _layer(imported) <= _layer(module), (
            f"{module} (layer {_layer(module)}) imports {imported} (layer {_layer(imported)}): "
            f"imports point down"
        )


def test_no_import_cycles_anywhere():
    graph = {module: _imports(module, path) for module, path in MODULES.items()}
    # Packages' __init__ re-export their modules: an edge into a package is an edge into what it re-
    # exports.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == "twice":
                continue
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state and module != "twice":
            visit(module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("twice.core")))
def test_core_is_pure(module):
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:  # module level: no torch, NumPy, files or processes on import
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            assert name.split(".")[0] not in IMPURE_MODULES, (
                f"{module} imports {name} at module level"
            )
    for node in ast.walk(tree):  # anywhere: no file or process calls
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            assert name not in FILE_CALLS, (
                f"{module} line {node.lineno} calls {name}(): core touches no files"
            )
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                assert name.split(".")[0] not in {"subprocess", "shutil", "tempfile", "socket"}, (
                    f"{module} line {node.lineno} imports {name}"
                )


# What reads the process's environment or raw memory: in the core neither happens (twice/_process.py
# does it for the core, below every layer, beside the compiled _native).
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
RAW_MEMORY_NAMES = {"from_address", "from_buffer", "addressof", "string_at", "memmove"}


def _reads_process_state(tree: ast.AST) -> list[str]:
    """Where `tree` reads the environment or raw memory: ctypes imported, an environment name
    or a ctypes memory call used (but through twice._process)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "_process":
            continue
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno} imports ctypes" for a in node.names
                      if a.name.split(".")[0] == "ctypes"]  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ctypes":
            found.append(f"line {node.lineno} imports from ctypes")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"line {node.lineno} imports os.{a.name}" for a in node.names
                      if a.name in ENVIRONMENT_NAMES]  # fmt: skip
        elif isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES:
            found.append(f"line {node.lineno} reads .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in RAW_MEMORY_NAMES:
            found.append(f"line {node.lineno} calls .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in ENVIRONMENT_NAMES | RAW_MEMORY_NAMES:
            found.append(f"line {node.lineno} names {node.value!r}")  # getattr(os, "environ")
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("twice.core")))
def test_core_reads_no_environment_and_no_raw_memory(module):
    """docs/ARCHITECTURE.md: a pure core on plain values; twice/_process.py reads for it."""
    found = _reads_process_state(ast.parse(MODULES[module].read_text()))
    assert found == [], f"{module}: {found}: read it through twice/_process.py, or above the core"


def test_the_process_state_scan_sees_planted_reads():
    source = (
        "import os, ctypes\nfrom os import getenv\nos.environ.get('X')\n"
        "(ctypes.c_char * 4).from_address(0)\nctypes.addressof(b)\nmemoryview(b).cast('B')\n"
        "_process.environ()\ngetattr(os, 'environ')\nvars(os)['getenv']\n"
    )
    assert len(_reads_process_state(ast.parse(source))) == 7


def test_a_twice_variable_spelled_in_pieces_is_seen():
    tree = ast.parse("os.environ.get('TWICE' + '_SEED')\nx = 'TW' + 'ICE_' + name\n")
    spelled = sorted(text for _, text in _strings(tree) if "TWICE_" in text)
    assert spelled == ["TWICE_", "TWICE_SEED"]  # a prefix built from pieces is a spelling too


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in LONG_MODULES))
def test_modules_hold_one_concept(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{module} has {lines} lines: split it by concept (at most {MAX_LINES})"
    )


@pytest.mark.parametrize("module", sorted(LONG_MODULES))
def test_long_modules_are_still_long(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines > MAX_LINES, f"{module} is {lines} lines now: take it off LONG_MODULES"
    held = LONG_MODULES[module][0]
    assert lines <= held, f"{module} grew to {lines} lines (held at {held}): split it"


# The C sources (twice._native: its families in csrc/, portable mode's in portable/native/csrc/),
# one family a file: each at most C_MAX_LINES lines of at most 100 columns (.clang-format's).
C_MAX_LINES = 800
C_SOURCES = sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".c", ".h"))


def test_the_c_sources_are_found():
    names = {p.relative_to(PACKAGE).as_posix() for p in C_SOURCES}
    assert {"_native.c", "portable/native/csrc/portable.h"} <= names


@pytest.mark.parametrize("path", C_SOURCES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_c_files_hold_one_family_in_short_lines(path):
    lines = path.read_text().splitlines()
    assert len(lines) <= C_MAX_LINES, f"{path.name} has {len(lines)} lines: split it by family"
    wide = [n for n, line in enumerate(lines, 1) if len(line) > 100]
    assert not wide, f"{path.name}: lines {wide[:5]} are over 100 columns"


# The C folders laid out by .clang-format (clang-format -i); csrc/ is to join them.
C_FORMATTED = ("portable/native/csrc", "csrc")


def test_c_files_keep_the_clang_format_layout():
    """The C folders of C_FORMATTED as .clang-format lays them out (clang-format: a test extra)."""
    import shutil
    import subprocess
    import sys

    tool = shutil.which("clang-format", path=str(Path(sys.executable).parent)) or shutil.which(
        "clang-format"
    )
    if tool is None:
        pytest.skip("clang-format is not installed (pip install clang-format)")
    formatted = {PACKAGE / folder for folder in C_FORMATTED}
    assert all(any(p.parent == f for p in C_SOURCES) for f in formatted)
    done = subprocess.run(
        [tool, "--dry-run", "--Werror", *(str(p) for p in C_SOURCES if p.parent in formatted)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]


# A function a reader takes in at once: past this, split it into helpers named for their steps.
MAX_FUNCTION_LINES = 120


def _long_functions(tree: ast.AST, limit: int) -> list[tuple[str, int, int]]:
    """(name, line of its `def`, length) of every function and method in `tree`, nested ones
    too, longer than `limit` lines from its `def` to the last line of its body."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_is_longer_than_a_reader_takes_in_at_once():
    long = [
        f"{module}.{name} (line {line}): {length} lines"
        for module, path in MODULES.items()
        for name, line, length in _long_functions(ast.parse(path.read_text()), MAX_FUNCTION_LINES)
    ]
    assert long == [], f"split into named helpers (at most {MAX_FUNCTION_LINES} lines): {long}"


def test_the_function_length_scan_counts_nested_functions_from_def_to_body_end():
    body = "\n".join(f"        x = {i}" for i in range(5))
    tree = ast.parse(f"@decorator\ndef outer():\n    def inner():\n{body}\n    return inner\n")
    assert _long_functions(tree, 4) == [("outer", 2, 8), ("inner", 3, 6)]
    assert _long_functions(tree, 8) == []


def _strings(tree: ast.AST):
    """(line, text) of every string constant in `tree` but docstrings, f-strings' parts too."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.lineno, node.value
        elif isinstance(node, ast.BinOp) and (joined := _joined(node)) is not None:
            yield node.lineno, joined  # "TWICE" + "_SEED": spelled all the same


def _joined(node: ast.AST) -> str | None:
    """The text of a sum of string constants ("a" + "b" + ...), None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _joined(node.left), _joined(node.right)
        return None if left is None or right is None else left + right
    return None


def test_file_names_are_spelled_in_their_homes():
    """docs/ARCHITECTURE.md: the run folder's file names are spelled in store/layout.py only."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        if module not in FILE_NAME_HOMES:
            found += [f"{module}:{line} {text!r}" for line, text in _strings(tree)
                      if FILE_NAME.match(text)]  # fmt: skip
        if module != "twice.store.layout":
            found += [
                f"{module}:{node.lineno} / {node.right.value!r}"
                for node in ast.walk(tree)
                if isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant)
                and node.right.value in RUN_SUBFOLDERS
            ]
    assert found == [], f"spell these in store/layout.py (RunFolder): {found}"


def test_the_file_name_scan_sees_a_planted_name():
    tree = ast.parse('"""trace.jsonl in a docstring is prose"""\nx = f"{run}/stderr.log"\n')
    assert [text for _, text in _strings(tree) if FILE_NAME.match(text)] == ["/stderr.log"]
    names = [".metadata", "dcp/.metadata", r"^(\.metadata|__\d_\d\.distcp)$", "*.distcp", "step-",
             r"^step-(\d{8,})$", "rank-", "__0_0.distcp"]  # fmt: skip
    assert all(FILE_NAME.match(name) for name in names)
    prose = ["torch.distributed.checkpoint.metadata", "a step-by step", "DCP's .metadata is bad",
             "stepping", "metadata"]  # fmt: skip
    assert not any(FILE_NAME.match(text) for text in prose)


def test_only_the_protocol_spells_twice_variables():
    """docs/ARCHITECTURE.md: no module but core/protocol.py spells a TWICE_* variable's name."""
    found = [
        f"{module}:{line} {text[:40]!r}"
        for module, path in MODULES.items()
        if module != "twice.core.protocol"
        for line, text in _strings(ast.parse(path.read_text()))
        if "TWICE_" in text
    ]
    assert found == [], f"read these through core/protocol.py's ChildSettings: {found}"


def test_commands_that_read_records_load_no_torch(tmp_path):
    """`twice diff`, `ls`, `show`, `stats` and `report` judge files: they must not pay for
    importing torch."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom twice import cli\n"
        "from twice.app import compare, report\nfrom twice.store import faults, runs, traces\n"
        "from twice.core import stats\nprint('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False"]


def test_public_functions_classes_and_methods_have_docstrings():
    missing = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        if not ast.get_docstring(tree) and not path.name.startswith("sitecustomize"):
            missing.append(f"{module} (module)")

        def visit(nodes, prefix, module=module):
            for node in nodes:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith(
                    "_"
                ):
                    if not ast.get_docstring(node):
                        missing.append(f"{module}.{prefix}{node.name}")
                    if isinstance(node, ast.ClassDef):
                        visit(node.body, f"{prefix}{node.name}.")

        visit(tree.body, "")
    assert missing == [], f"document these: {missing}"


# A module looked up by a name computed at run time is an import edge no scan can see. The few
# places that do so, each with why the edge stays inside its own layer.
COMPUTED_LOOKUPS = {
    "twice.portable.dispatch.optext": "the op table's headings take each ops/ module's docstring "
    "(modules of portable, its own layer)",
    "twice.portable.dispatch.entrypoints": "walks portable.native's and portable.ops' modules to "
    "find the C entry points each calls (its own layer)",
    "twice.portable.dispatch.optests": "resolves a test file's dotted names to the objects they "
    "name, for the op table's tests column (the op table's own generator, never at run time)",
    "twice": "the package's lazy exports, each one of its own submodules named in _EXPORTS",
    "twice.runtime.imports": "the import watcher looks up the parent of whatever the user's "
    "program imports (user modules, never twice's)",
    "twice.runtime.seedcalls": "finds the module of the user's frame that called a seeding API",
}


def _computed_lookups(path: Path) -> list[int]:
    """Lines where import_module, __import__ or sys.modules takes a name that is not a string."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        if isinstance(node, ast.Call) and node.args:
            callee = getattr(node.func, "attr", getattr(node.func, "id", None))
            if callee in ("import_module", "__import__") or (
                isinstance(node.func, ast.Attribute) and _is_sys_modules(node.func.value)
            ):
                name = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
            name = node.slice
        if name is not None and not isinstance(name, (ast.Constant, ast.Name)):
            lines.append(node.lineno)
    return lines


def test_a_module_looked_up_by_a_computed_name_is_listed_with_its_reason():
    found = {module for module, path in MODULES.items() if _computed_lookups(path)}
    assert found == set(COMPUTED_LOOKUPS), sorted(found ^ set(COMPUTED_LOOKUPS))


def test_the_computed_lookup_scan_sees_each_form(tmp_path):
    for source in (
        "import sys\nsys.modules['twice.' + x]\n",
        "import sys\nsys.modules.get(f'twice.{x}')\n",
        "import importlib\nimportlib.import_module('twice.' + x)\n",
    ):
        planted = tmp_path / "planted.py"
        planted.write_text(source)
        assert _computed_lookups(planted), source


def _dims_wrapped_by_hand(source: str) -> list[int]:
    """Lines that wrap a dimension by hand: `d % x.dim()` (or `% max(x.dim(), 1)`, `.ndim`),
    which turns an index out of range into another dimension where torch raises IndexError."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            for inner in ast.walk(node.right):
                called = isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                if (called and inner.func.attr in ("dim", "ndimension")) or (
                    isinstance(inner, ast.Attribute) and inner.attr == "ndim"
                ):
                    found.append(node.lineno)
                    break
    return found


def test_portable_kernels_wrap_dimensions_by_torchs_rule():
    """A kernel wraps a dimension argument with torch's own `canonicalize_dim`, which raises
    torch's IndexError out of range, never with `%` (a 2-d tensor's sum over dim 5 summed dim 1)."""
    hand = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted((PACKAGE / "portable").rglob("*.py"))
        if (lines := _dims_wrapped_by_hand(path.read_text()))
    }
    assert hand == {}


def test_the_dimension_scan_sees_each_form():
    planted = "a = d % x.dim()\nb = d % max(x.dim(), 1)\nc = d % t.ndim\nd = d % 4\n"
    assert _dims_wrapped_by_hand(planted) == [1, 2, 3]
