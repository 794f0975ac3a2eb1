"""twice.testing: reproducibility assertions and golden traces for users' test suites, and the
pytest plugin."""

import subprocess
import sys
import time

import pytest
import torch
from conftest import clean_env

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


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_the_pytest_plugin_offers_the_update_flag_and_fixture(tmp_path):
    (tmp_path / "test_user.py").write_text(
        "import torch\nfrom twice.testing import assert_matches_golden\n"
        "def train():\n    m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "    for _ in range(3):\n        o.zero_grad(); m(torch.randn(4, 2)).sum().backward(); "
        "o.step()\n"
        "def test_golden(twice_update_golden):\n"
        "    assert_matches_golden(train, 'golden.jsonl', update=twice_update_golden)\n"
    )
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],  # noqa: E731
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    updated = run("--twice-update-golden")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert (tmp_path / "golden.jsonl").is_file()
    assert run().returncode == 0
    # From another folder the golden file is still the one beside the test file.
    elsewhere = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path.parent,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert elsewhere.returncode == 0, elsewhere.stdout + elsewhere.stderr
    assert not (tmp_path.parent / "golden.jsonl").exists()


def test_the_pytest_plugin_imports_neither_numpy_nor_torch():
    probe = (
        "import sys, twice.pytest_plugin; "
        "print(sorted(m for m in ('numpy', 'torch', 'twice.app.testing') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=clean_env()
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
