import os
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import clean_env

import twice
from twice.core.errors import DeterminismError
from twice.runtime.determinism import CUBLAS_WORKSPACE, hash_seed_in_effect


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=120,
    )


def test_strict_mode_refuses_when_pythonhashseed_was_not_fixed_at_start():
    result = run_python(
        "import torch, twice\ntry:\n twice.deterministic(seed=0)\nexcept twice.DeterminismError "
        "as e:\n print(e.render())"
    )
    assert "error: PYTHONHASHSEED was not fixed when the interpreter started" in result.stdout
    assert "hint:" in result.stdout


def test_setting_pythonhashseed_after_start_is_not_mistaken_for_fixed():
    code = (
        "import os; os.environ['PYTHONHASHSEED'] = '7'\nfrom twice.runtime.determinism "
        "import hash_seed_in_effect\nprint(hash_seed_in_effect())"
    )
    assert run_python(code).stdout.strip() == "None"
    assert (
        run_python(
            "from twice.runtime.determinism import "
            "hash_seed_in_effect\nprint(hash_seed_in_effect())",
            PYTHONHASHSEED="7",
        ).stdout.strip()
        == "7"
    )


def test_strict_mode_applies_every_setting_when_started_right():
    code = (
        "import torch, twice, json\nr = twice.deterministic(seed=3)\n"
        "print(json.dumps(r.to_json()['settings']))\nprint(torch.are_deterministic_algorithms_enabled())"
    )
    result = run_python(code, PYTHONHASHSEED="0")
    assert result.returncode == 0, result.stderr
    import json

    settings = json.loads(result.stdout.splitlines()[0])
    assert settings["deterministic_algorithms"]["in_effect"] == "strict"
    assert settings["cudnn.benchmark"]["in_effect"] is False
    assert settings["cuda.matmul.allow_tf32"]["in_effect"] is False
    assert settings["CUBLAS_WORKSPACE_CONFIG"]["in_effect"] == CUBLAS_WORKSPACE
    assert settings["PYTHONHASHSEED"]["in_effect"] == "0"
    assert result.stdout.splitlines()[1] == "True"


def test_warn_mode_warns_and_reports_what_is_not_in_effect():
    if hash_seed_in_effect() is not None:
        pytest.skip("this test process was started with PYTHONHASHSEED fixed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with twice.deterministic(seed=0, mode="warn") as report:
            assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert any("PYTHONHASHSEED" in str(w.message) for w in caught)
    assert [p.name for p in report.problems] == ["PYTHONHASHSEED"]


def test_cublas_workspace_is_set_and_removed_again_by_the_context_manager():
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with twice.deterministic(mode="warn"):
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_off_mode_changes_nothing_and_reports_the_current_state():
    torch.use_deterministic_algorithms(False)
    report = twice.deterministic(mode="off")
    assert torch.are_deterministic_algorithms_enabled() is False
    assert {s.name: s.in_effect for s in report.settings}["deterministic_algorithms"] == "off"


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode must be one of"):
        twice.deterministic(mode="sometimes")


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: no CUDA device on this machine"
)
def test_strict_mode_refuses_when_cuda_started_without_cublas_workspace():
    code = (
        "import torch, twice\ntorch.ones(1, device='cuda')\ntry:\n twice.deterministic(seed=0)\n"
        "except twice.DeterminismError as e:\n print(e.render())"
    )
    result = run_python(code, PYTHONHASHSEED="0")
    assert "error: CUDA was initialised before CUBLAS_WORKSPACE_CONFIG was set" in result.stdout


def test_determinism_error_is_a_twice_error_with_exit_code_2():
    assert issubclass(DeterminismError, twice.TwiceError) and DeterminismError("x").exit_code == 2
