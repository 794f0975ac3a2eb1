"""Every Python file the prose cites exists: a module moved or renamed takes its citations along.

The prose is src/'s docstrings and comments (Python's; the C sources' whole text, where only
comments name a .py file) and docs/*.md. A citation is a path ending in `.py`
(`core/protocol.py`, `twice/_fold_kernel.py`, `unit/portable/test_fused.py`) or a bare module
file name (`mode.py`). A path exists when it lies relative to the citing file, the repository,
src/, src/twice/ or tests/, or ends a path of the repository's Python files (`ops/recurrent.py`
cited from portable/'s README); a bare name when some Python file of twice, its tests, its
benches or its root has that name.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "twice"

# Names in examples and references that are no file of twice's, each with why.
NOT_OURS = {
    "train.py": "the user's training script in examples (twice run -- python train.py)",
    "t.py": "a user's script in a --help example",
    "s.py": "a user's script in an example",
    "clock_seed.py": "a user's script seeding from the clock, in an example",
    "config/x.py": "a nanoGPT config file in an example",
    "config/train_shakespeare_char.py": "nanoGPT's config in an example",
}
CITATION = re.compile(r"(?<![\w./-])((?:\.\.?/)*(?:[\w.-]+/)*[A-Za-z_]\w*\.py)(?![\w/-]|\.\w)")


def _python_files() -> list[Path]:
    found = []
    for folder in ("src", "tests", "bench", "scripts"):
        found += [p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts]
    return found + sorted(ROOT.glob("*.py"))


PYTHON_FILES = _python_files()
NAMES = {path.name for path in PYTHON_FILES}
POSIX = [path.relative_to(ROOT).as_posix() for path in PYTHON_FILES]


def _prose_of_python(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each comment and docstring of a Python file."""
    source = path.read_text()
    prose = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                prose.append((node.body[0].lineno, docstring))
    return prose


def _prose() -> list[tuple[Path, int, str]]:
    """Every piece of prose that may cite a file: (file, line, text)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += [(path, line, text) for line, text in _prose_of_python(path)]
    for pattern in ("*.c", "*.h", "*.md"):
        for path in sorted(PACKAGE.rglob(pattern)):
            found += [(path, n, t) for n, t in enumerate(path.read_text().splitlines(), 1)]
    for path in sorted((ROOT / "docs").glob("*.md")):
        found += [(path, n, t) for n, t in enumerate(path.read_text().splitlines(), 1)]
    return found


def _exists(cited: str, citing: Path) -> bool:
    if cited in NOT_OURS:
        return True
    if "/" not in cited:
        return cited in NAMES
    for base in (citing.parent, ROOT, SRC, PACKAGE, ROOT / "tests"):
        if (base / cited).is_file():
            return True
    tail = "/" + cited.lstrip("./")
    return not cited.startswith(".") and any(path.endswith(tail) for path in POSIX)


def _citations(text: str) -> list[str]:
    return [match.group(1) for match in CITATION.finditer(text)]


def test_every_cited_python_file_exists():
    missing = [
        f"{path.relative_to(ROOT)}:{line} cites {cited}"
        for path, line, text in _prose()
        for cited in _citations(text)
        if not _exists(cited, path)
    ]
    assert missing == [], "cite the module where it lives now:\n" + "\n".join(missing)


def test_the_citation_scan_reads_paths_and_names_and_no_more():
    text = (
        "see core/protocol.py, `twice/_fold_kernel.py`, (mode.py) and ../src/twice/cli/group.py;"
        " twice.core.digests is dotted, module.pyc and x.py.bak are other files"
    )
    assert _citations(text) == [
        "core/protocol.py",
        "twice/_fold_kernel.py",
        "mode.py",
        "../src/twice/cli/group.py",
    ]
    here = PACKAGE / "core" / "digests.py"
    assert _exists("core/protocol.py", here) and _exists("twice/_fold_kernel.py", here)
    assert _exists("protocol.py", here) and _exists("dispatch/routes.py", here)
    assert not _exists("sample_rng.py", here) and not _exists("core/data.py", here)
    assert not _exists("ops_math.py", here)


def test_the_architecture_names_every_module_of_each_layer():
    """docs/ARCHITECTURE.md's table of layers names each module and subpackage of each folder in
    its row (`records`), or elsewhere as `folder/module`: a new module is placed there too."""
    from house.test_architecture import LAYERS

    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)/` \|(.*)\|\s*$", doc, re.MULTILINE))
    unnamed = []
    for layer in LAYERS:
        if layer == "integrations":  # its row names the libraries, one module each
            continue
        named = set(re.findall(r"`(\w+)`", rows[layer]))
        folder = PACKAGE / layer
        modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        modules |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
        unnamed += [f"{layer}/{m}" for m in sorted(modules - named) if f"`{layer}/{m}`" not in doc]
    assert unnamed == [], f"say in docs/ARCHITECTURE.md's table what these hold: {unnamed}"


def test_the_names_that_are_not_ours_are_not_ours():
    """An entry of NOT_OURS that became a file of twice's would hide a stale citation of it."""
    assert [name for name in NOT_OURS if name.rpartition("/")[2] in NAMES] == []
