"""Tests mirror the source: every module `twice/<path>/<stem>.py` has its home
`tests/unit/<path>/test_<stem>.py`, and that file imports the module it is the home of.

`__init__.py` files and `runtime/_boot/` (run by Python at start-up, tested through processes) have
no home. PENDING lists the modules that have none yet; it may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import twice

PACKAGE = Path(twice.__file__).parent
TESTS = Path(__file__).resolve().parents[1]
UNIT = TESTS / "unit"

# Modules without a home today. Not a licence: a module leaves the list when its home is written
# (test_pending_modules_have_no_home fails until it does), and a new module comes with its home.
PENDING: set[str] = set()


def _modules() -> dict[str, Path]:
    """Every module that has a home, by dotted name, with its path inside the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or relative.parts[:2] == ("runtime", "_boot"):
            continue
        found["twice." + ".".join(relative.with_suffix("").parts)] = relative
    return found


MODULES = _modules()


def home(module: str) -> Path:
    """Where the tests of `module` live: `twice/a/b.py` -> `tests/unit/a/test_b.py`."""
    relative = MODULES[module]
    return UNIT.joinpath(*relative.parts[:-1], f"test_{relative.stem}.py")


def _imported(source: str) -> set[str]:
    """The modules a test file imports, anywhere in it: `import twice.a.b`, `from twice.a import
    b` (both twice.a and twice.a.b), `from twice.a.b import c`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def has_home(module: str) -> bool:
    """Whether the module's home exists and imports it."""
    path = home(module)
    return path.is_file() and module in _imported(path.read_text())


def test_every_module_has_a_home_or_is_pending():
    missing = sorted(m for m in MODULES if m not in PENDING and not has_home(m))
    assert not missing, "modules without a home (a test file that imports them): " + ", ".join(
        f"{m} -> {home(m).relative_to(TESTS.parent)}" for m in missing
    )


def test_pending_modules_have_no_home():
    housed = sorted(m for m in PENDING & MODULES.keys() if has_home(m))
    assert not housed, f"these have a home now: take them off PENDING: {', '.join(housed)}"


def test_pending_names_only_modules_that_exist():
    assert not PENDING - MODULES.keys(), f"not modules: {sorted(PENDING - MODULES.keys())}"


def test_the_import_scan_sees_every_form():
    source = "import twice.a.b\nfrom twice.c import d\ndef f():\n    from twice.e.f import g\n"
    assert {"twice.a.b", "twice.c.d", "twice.e.f"} <= _imported(source)
    assert "twice.x.y" not in _imported("import twice.x\n")


def test_every_test_folder_is_a_package():
    folders = {p.parent for p in (TESTS / "unit").rglob("test_*.py")}
    folders |= {p.parent for p in (TESTS / "e2e").glob("test_*.py")}
    folders |= {p.parent for p in (TESTS / "house").glob("test_*.py")}
    loose = sorted(str(f.relative_to(TESTS)) for f in folders if not (f / "__init__.py").is_file())
    assert not loose, f"test folders without __init__.py: {loose}"
