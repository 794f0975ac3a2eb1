"""The bootstrap, run at interpreter start in every Python process of `twice run`: Python's RNG
seeded at once, NumPy's when it is imported, nothing at all outside `twice run` (processes of
their own: it changes a process for its life)."""

import os
import random
import subprocess
import sys

from conftest import clean_env

from twice.core.protocol import ChildSettings
from twice.runtime.bootstrap import boot

DRAWS = """
from twice.runtime.bootstrap import boot
boot()
import random
first = random.random()
import numpy
print(first, numpy.random.rand())
"""


def _draws(tmp_path, **settings):
    env = clean_env(**(ChildSettings(**settings).to_env() if settings else {}))
    result = subprocess.run(
        [sys.executable, "-c", DRAWS], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_run_seeds_python_at_once_and_numpy_on_import_from_its_seed(tmp_path):
    first = _draws(tmp_path, run_dir=str(tmp_path), seed=5)
    assert _draws(tmp_path, run_dir=str(tmp_path), seed=5) == first
    assert _draws(tmp_path, run_dir=str(tmp_path), seed=6) != first


def test_outside_twice_run_it_changes_nothing(tmp_path, monkeypatch):
    assert _draws(tmp_path) != _draws(tmp_path)  # unseeded: other numbers every process
    for name in [name for name in os.environ if name.startswith("TWICE_")]:
        monkeypatch.delenv(name)
    state, finders = random.getstate(), list(sys.meta_path)
    boot()  # this process is not a run's: a no-op here too
    assert random.getstate() == state and sys.meta_path == finders
