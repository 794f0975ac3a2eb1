"""A vision transformer as timm builds one (its trunc_normal_ through erfinv, patch embedding,
attention, GELU, layer norm, stochastic depth, AdamW) trained under `twice run --portable` at 1
thread on the baseline instruction set and at 2 threads on the best one: byte-identical
weights, losses and traces."""

import json
import sys

from conftest import clean_env, runs, script, twice

from e2e.test_portable_runs import _capabilities


def _train(folder, env):
    folder.mkdir()
    script("portable_vit.py", folder)
    result = twice(
        "run", "--portable", "--", sys.executable, "portable_vit.py",
        cwd=folder, env=clean_env(**env), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def test_a_vit_trains_to_byte_identical_weights_at_both_settings(tmp_path):
    one = _train(tmp_path / "one", {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"})
    best = {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": _capabilities()[-1]}
    two = _train(tmp_path / "two", best)
    assert (one / "vit_params.pt").read_bytes() == (two / "vit_params.pt").read_bytes()
    assert json.loads((one / "vit.json").read_text()) == json.loads((two / "vit.json").read_text())
    compared = twice("diff", runs(one)[-1], runs(two)[-1], cwd=tmp_path)
    assert compared.returncode == 0 and "bit-identical" in compared.stdout, compared.stdout
