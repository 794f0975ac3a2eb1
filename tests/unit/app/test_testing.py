"""app/testing (twice.testing): reproducibility assertions and golden traces for users' own test
suites."""

import time

import pytest
import torch

import twice
from twice.app.testing import (
    assert_bitwise_resume,
    assert_matches_golden,
    assert_reproducible,
)


def make_train(noise=False, lr=0.1):
    def train():
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(10):  # noqa: B007
            x = torch.randn(16, 4)
            if noise:
                x = (
                    x
                    + torch.randn(16, 4, generator=torch.Generator().manual_seed(time.time_ns()))
                    * 1e-3
                )
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    return train


def test_a_seeded_training_function_is_reproducible():
    assert_reproducible(make_train(), steps=6)


def test_run_dependent_noise_fails_with_the_first_divergence():
    with pytest.raises(
        AssertionError, match=r"training is not reproducible: first divergence at step 0 \("
    ):
        assert_reproducible(make_train(noise=True), steps=6)


def make_resumable(track_optimizer=True):
    def train():
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with twice.Run() as run:
            run.track(model=model, **({"optimizer": opt} if track_optimizer else {}))
            run.resume()
            for step in range(run.step_index, 10):  # noqa: B007
                opt.zero_grad()
                model(torch.randn(16, 4)).pow(2).mean().backward()
                opt.step()

    return train


def test_a_training_function_that_checkpoints_everything_resumes_bit_for_bit():
    assert_bitwise_resume(make_resumable(), steps=8, at=3)


def test_a_checkpoint_without_the_optimizer_fails_naming_what_was_lost():
    with pytest.raises(
        AssertionError,
        match="resume differs: first divergence at step 3 .*the optimizer's state was not restored",
    ):
        assert_bitwise_resume(make_resumable(track_optimizer=False), steps=8, at=3)


def test_a_training_function_that_never_checkpoints_is_told_how_to():
    with pytest.raises(
        AssertionError, match="no checkpoint was written when the run stopped after step 3"
    ):
        assert_bitwise_resume(make_train(), steps=8, at=3)


def test_golden_trace_is_written_then_matched_then_a_change_is_caught(tmp_path):
    golden = tmp_path / "golden" / "train.jsonl"
    with pytest.raises(AssertionError, match="no golden trace"):
        assert_matches_golden(make_train(), golden, steps=5)
    assert golden.is_file()
    assert_matches_golden(make_train(), golden, steps=5)
    with pytest.raises(
        AssertionError, match="differs from the golden trace .* first divergence at step 0"
    ):
        assert_matches_golden(make_train(lr=0.2), golden, steps=5)
    assert_matches_golden(make_train(lr=0.2), golden, steps=5, update=True)
    assert_matches_golden(make_train(lr=0.2), golden, steps=5)
