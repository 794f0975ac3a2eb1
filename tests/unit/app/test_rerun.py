"""app/rerun: a recorded run's command started again, only from an admitted Rerun, with the
settings it was recorded with."""

import pytest

from twice.app.rerun import rerun_options, start_rerun
from twice.app.trust import admit
from twice.core.errors import UsageError
from twice.core.manifest import Manifest


def _rerun(tmp_path, cwd, env=None):
    manifest = {
        "identity": {"argv": ["python", "train.py"], "seed": 11, "env": env or {}},
        "context": {"status": "completed", "cwd": str(cwd), "steps": 9, "trace_every": 3},
    }
    return admit(tmp_path / "runs" / "a", Manifest.from_json(manifest, "manifest.json"), yes=True)


def test_a_rerun_has_the_recorded_seed_settings_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AUTO")  # replayable, and the original lacked it: removed
    rerun = _rerun(tmp_path, tmp_path, env={"OMP_NUM_THREADS": "2", "LD_PRELOAD": "/x.so"})
    options = rerun_options(rerun, name="verify-" + "x" * 200, steps=5, quiet=True)
    assert (options.seed, options.trace_every, options.stop_after) == (11, 3, 5)
    assert options.env == {"OMP_NUM_THREADS": "2"} and options.unset_env == ("MKL_CBWR",)
    assert options.runs_dir == (tmp_path / "runs").resolve() and options.cwd == tmp_path
    assert len(options.name) == 100 and options.expected_steps == 9 and options.quiet


def test_a_rerun_whose_folder_is_gone_or_that_was_not_admitted_does_not_start(tmp_path):
    with pytest.raises(UsageError, match="no longer exists"):
        rerun_options(_rerun(tmp_path, tmp_path / "gone"), name="verify")
    options = rerun_options(_rerun(tmp_path, tmp_path), name="verify")
    with pytest.raises(TypeError, match="takes a Rerun from app/trust.py, not list"):
        start_rerun(["python", "train.py"], options)
