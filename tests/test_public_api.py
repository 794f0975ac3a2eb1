"""The public surface is small and explicit, and imports point one way (core never imports the shell)."""

import ast
from pathlib import Path

import twice

PACKAGE = Path(twice.__file__).parent

# Layers, lowest first: a module may import only from its own layer or lower ones.
LAYERS = [
    # pure core (and _native, the C module: it imports nothing of twice's; its loader loop writes
    # RNG memory only at the addresses data.py hands it)
    {"errors", "seeds", "digests", "manifest", "trace", "divergence", "imports", "opdiff", "stats", "_native"},
    {"seeding", "sample_rng", "determinism", "instrument", "data", "oplog", "numerics", "streams", "files",
     "parallel"},                                                                # process state
    {"capture", "store", "hazards", "compare", "checkpoint", "metrics"},                    # I/O
    {"bootstrap", "launch", "run", "verify", "locate", "sweep", "report", "testing"},                                  # orchestration
    {"integrations"},                                                            # optional extras (a package)
    {"cli", "__main__"},                                                         # command line
]


def test_exported_names_are_exactly_the_documented_ones():
    assert set(twice.__all__) == {
        "seed_everything", "deterministic", "DeterminismReport", "derive_seed", "digest", "Run", "TwiceError",
        "DeterminismError", "StepRecord", "read_trace", "first_divergence", "compare_runs", "checkpoint_dir",
        "checkpoint", "data", "numerics", "parallel", "stream", "log_metric", "__version__",
    }
    for name in twice.__all__:
        assert getattr(twice, name) is not None


def test_importing_twice_loads_neither_torch_nor_numpy():
    import subprocess
    import sys

    code = "import sys, twice; print('torch' in sys.modules, 'numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == ["False", "False"]


def _imports(path: Path) -> set[str]:
    """twice's modules that `path` imports (relative imports in the package, `twice.x` in subpackages)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and path.parent == PACKAGE:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("twice."):
            found.add(node.module.split(".")[1])
    return found - {"integrations"} if path.parent.name == "integrations" else found


def test_imports_point_one_way():
    layer_of = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    files = {p.stem: [p] for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    files["integrations"] = sorted((PACKAGE / "integrations").glob("*.py"))
    assert set(files) <= set(layer_of), f"place new modules in a layer: {set(files) - set(layer_of)}"
    for module, paths in files.items():
        for path in paths:
            for imported in _imports(path):
                assert layer_of[imported] <= layer_of[module], f"{path.name} (layer {layer_of[module]}) imports {imported}"
