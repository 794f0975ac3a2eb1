"""The public surface is small and explicit: `twice.__all__`, and importing twice stays cheap."""

import twice


def test_exported_names_are_exactly_the_documented_ones():
    assert set(twice.__all__) == {
        "seed_everything",
        "deterministic",
        "DeterminismReport",
        "derive_seed",
        "digest",
        "Run",
        "TwiceError",
        "DeterminismError",
        "StepRecord",
        "read_trace",
        "first_divergence",
        "compare_runs",
        "checkpoint_dir",
        "checkpoint",
        "data",
        "numerics",
        "parallel",
        "stream",
        "log_metric",
        "__version__",
    }
    for name in twice.__all__:
        assert getattr(twice, name) is not None


def test_importing_twice_loads_neither_torch_nor_numpy():
    import subprocess
    import sys

    code = "import sys, twice; print('torch' in sys.modules, 'numpy' in sys.modules)"
    assert subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    ).stdout.split() == ["False", "False"]
