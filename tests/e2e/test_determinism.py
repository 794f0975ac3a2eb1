"""Deterministic mode in processes of their own: what it refuses depends on how the interpreter
started (PYTHONHASHSEED fixed or not, CUDA up before CUBLAS_WORKSPACE_CONFIG); in process:
tests/unit/runtime/test_determinism.py."""

import subprocess
import sys

import pytest
import torch
from conftest import clean_env

from twice.runtime.determinism import CUBLAS_WORKSPACE


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
