"""twice's pytest plugin: the `--twice-update-golden` option and its fixture, loaded through
pytest's entry point in every session, this one included, importing nothing heavy."""

import subprocess
import sys

from conftest import clean_env

from twice import pytest_plugin


def test_this_session_has_the_plugin_its_option_off_and_its_fixture(twice_update_golden, request):
    assert request.config.pluginmanager.is_registered(pytest_plugin)  # by its entry point
    assert request.config.getoption("--twice-update-golden") is False
    assert twice_update_golden is False


def test_the_option_turns_the_fixture_on_in_a_session_of_its_own(tmp_path):
    (tmp_path / "test_user.py").write_text(
        "def test_flag(twice_update_golden):\n    assert twice_update_golden is True\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--twice-update-golden"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr


def test_the_pytest_plugin_imports_neither_numpy_nor_torch():
    probe = (
        "import sys, twice.pytest_plugin; "
        "print(sorted(m for m in ('numpy', 'torch', 'twice.app.testing') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=clean_env()
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
