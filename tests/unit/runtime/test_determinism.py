"""Deterministic mode in this process: warn mode reports what is not in effect, the context
manager puts every setting back, off mode changes nothing."""

import os
import warnings

import pytest
import torch

import twice
from twice.core.errors import DeterminismError
from twice.runtime.determinism import CUBLAS_WORKSPACE, hash_seed_in_effect


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


def test_determinism_error_is_a_twice_error_with_exit_code_2():
    assert issubclass(DeterminismError, twice.TwiceError) and DeterminismError("x").exit_code == 2
