"""The layers, at run time: importing a layer's modules loads no module of a higher layer.

tests/house/test_architecture.py reads the source; this imports it, as click's
tests/test_imports.py does: a fresh interpreter per layer imports every module of that layer
(lowest first, in LAYERS' order, the modules below every layer first) and reports the twice
modules it then holds. An import hidden from the scan (built from a computed name, done by a
library on twice's behalf) shows up here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import clean_env

from house.test_architecture import LAYERS, MODULES, TOP_LEVEL, _layer

# Imported by no one as a module: `twice run` puts its folder on PYTHONPATH, where it runs the
# bootstrap and then the sitecustomize it shadows (its imports are scanned statically).
NOT_IMPORTED = {"twice.runtime._boot.sitecustomize"}

_PROBE = """
import importlib, json, sys
absent = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an optional extra that is not installed here
        if (exc.name or "").split(".")[0] == "twice":
            raise
        absent[name] = exc.name
print(json.dumps({"loaded": sorted(m for m in sys.modules if m.startswith("twice.")),
                  "absent": absent}))
"""


def _by_layer() -> dict[int, list[str]]:
    layers: dict[int, list[str]] = {}
    for module in sorted(MODULES):
        if module != "twice" and module not in NOT_IMPORTED:
            layers.setdefault(_layer(module), []).append(module)
    return layers


LAYER_MODULES = _by_layer()
# below every layer (the compiled modules, the pytest plugin), then LAYERS lowest first; the top
# (cli, the facades) has nothing above it
CHECKED = [layer for layer in sorted(LAYER_MODULES) if layer < len(LAYERS)]


def _name(layer: int) -> str:
    return LAYERS[layer] if 0 <= layer < len(LAYERS) else "below every layer"


def test_every_layer_is_checked():
    assert CHECKED == [-1, *range(len(LAYERS))]
    assert min(TOP_LEVEL.values()) == -1


@pytest.mark.parametrize("layer", CHECKED, ids=_name)
def test_importing_a_layer_loads_nothing_above_it(layer):
    modules = LAYER_MODULES[layer]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    above = [
        f"{module} (layer {_name(_layer(module))})"
        for module in found["loaded"]
        if _layer(module) > layer
    ]
    assert above == [], f"importing {_name(layer)} ({modules}) loaded {above}"
    # every module was imported, but an optional extra's that is not installed here
    assert set(found["absent"]) <= {m for m in modules if m.startswith("twice.integrations.")}, (
        found["absent"]
    )


def test_the_probe_sees_a_module_of_a_higher_layer():
    """A layer that loads one above it is found: twice.core.errors loads no app module, but the
    probe, asked for both, reports twice.app.terminal's layer above the core."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "twice.core.errors", "twice.app.terminal"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
    )
    loaded = json.loads(done.stdout.strip().splitlines()[-1])["loaded"]
    assert "twice.app.terminal" in loaded
    assert [m for m in loaded if _layer(m) > LAYERS.index("core")]
