"""Reproducibility assertions for a user's own test suite, and a pytest plugin.

    from twice.app.testing import assert_bitwise_resume, assert_matches_golden, assert_reproducible

    def test_training_is_reproducible():
        assert_reproducible(train, steps=20)            # train() trains with torch.optim

    def test_training_resumes_bit_for_bit():
        assert_bitwise_resume(train, steps=20, at=7)    # train() checkpoints and resumes with
        twice.Run

    def test_training_matches_the_golden_trace(twice_update_golden):
        assert_matches_golden(train, "golden/train.jsonl", steps=20,
        update=twice_update_golden)

A relative golden path is taken from the folder of the test file that calls
assert_matches_golden, wherever pytest runs from. `pytest --twice-update-golden` (the plugin in
twice.pytest_plugin) rewrites golden traces instead of comparing with them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from twice.core.divergence import divergence_phrase, first_divergence
from twice.runtime.determinism import deterministic
from twice.store.layout import RunFolder
from twice.store.traces import read_trace

__all__ = ["assert_reproducible", "assert_matches_golden", "assert_bitwise_resume", "record_trace"]


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _record_into(
    folder: Path, train_fn: Callable[[], object], steps: int | None, seed: int, **env: str
) -> list:
    """Run `train_fn` as if under `twice run` with its run folder `folder`: seeded, deterministic
    (warn mode), recorded, stopped after `steps`; a twice.Run inside joins this recording."""
    from twice.core.protocol import ChildSettings
    from twice.record import hooks
    from twice.record.recorder import Recorder

    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PYTHONHASHSEED cannot be fixed from inside a test process
        report = deterministic(seed=seed, mode="warn")
    recorder = hooks.install(Recorder(folder, stop_after=steps, params_every=1))
    try:
        with _environ(**ChildSettings(run_dir=str(folder)).to_env(), **env):
            train_fn()
    except SystemExit:
        if not recorder.stopped:
            raise  # the training function's own exit, not our step limit
    finally:
        hooks.uninstall()
        report.restore()
    return read_trace(RunFolder(folder).trace())


def record_trace(train_fn: Callable[[], object], steps: int | None = None, seed: int = 0) -> list:
    """Run `train_fn` seeded and deterministic (warn mode), recording its step trace; stop after
    `steps`."""
    folder = Path(tempfile.mkdtemp(prefix="twice-test-"))
    try:
        return _record_into(folder, train_fn, steps, seed)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _describe(a, b) -> str | None:
    found = first_divergence(a, b)
    if found is not None:
        tensors = found.tensors.get(found.first)
        return (
            divergence_phrase(found)
            + (f": {', '.join(tensors[:4])}" if tensors else "")
            + f"; fields differing: {', '.join(found.fields)}"
        )
    if len(a) != len(b):
        return f"the traces agree on their common steps but have {len(a)} and {len(b)} steps"
    return None


def assert_reproducible(
    train_fn: Callable[[], object], steps: int | None = None, seed: int = 0
) -> None:
    """Run `train_fn` twice with the same seed; fail with the first divergence unless every step
    is bit-identical."""
    first, second = record_trace(train_fn, steps, seed), record_trace(train_fn, steps, seed)
    if not first:
        raise AssertionError(
            "no training step was recorded: does train_fn step a torch.optim optimizer?"
        )
    problem = _describe(first, second)
    if problem:
        raise AssertionError(f"training is not reproducible: {problem}")


def assert_matches_golden(
    train_fn: Callable[[], object],
    golden: str | Path,
    steps: int | None = None,
    seed: int = 0,
    update: bool = False,
) -> None:
    """Compare `train_fn`'s trace with a golden trace kept in the repository (`update=True`
    rewrites it). A relative `golden` is relative to the calling file's folder."""
    import sys

    from twice.store.files import write_bytes_atomic

    golden = Path(golden)
    if not golden.is_absolute():  # beside the test that names it, not where pytest was started
        caller = Path(sys._getframe(1).f_code.co_filename)
        if caller.is_file():
            golden = caller.resolve().parent / golden
    records = record_trace(train_fn, steps, seed)
    if update or not golden.exists():
        import json

        golden.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            json.dumps({k: v for k, v in r.to_json().items() if k != "time"}, sort_keys=True)
            for r in records
        ]
        write_bytes_atomic(golden, ("\n".join(lines) + "\n").encode())
        if not update:
            raise AssertionError(
                f"no golden trace at {golden}: wrote one from this run; commit it and run again"
            )
        return
    problem = _describe(read_trace(golden), records)
    if problem:
        raise AssertionError(
            f"trace differs from the golden trace {golden}: {problem} "
            "(if the change is intended: pytest --twice-update-golden)"
        )


def assert_bitwise_resume(
    train_fn: Callable[[], object], steps: int, at: int, seed: int = 0
) -> None:
    """Train `steps` steps straight; again, interrupted after step `at`; then resumed from that
    interruption's checkpoint. Fail, naming what the checkpoint lost, unless the resumed steps and
    the final parameters are bit-identical to the straight run's.

    `train_fn` checkpoints and resumes the way it does under `twice run`: through a `twice.Run`
    (`run.track(...)`, `run.resume()`: the interrupted run checkpoints as it stops), or with its
    own checkpoints in `twice.checkpoint_dir()`.
    """
    import twice.checkpoint as checkpoints
    from twice.app.verify import compare_resumed
    from twice.core.protocol import ChildSettings

    if not 1 <= at < steps:
        raise ValueError(f"at={at} must be a step between 1 and steps-1={steps - 1}")
    folder = Path(tempfile.mkdtemp(prefix="twice-test-"))
    try:
        straight = _record_into(folder / "straight", train_fn, steps, seed)
        if len(straight) < steps:
            raise AssertionError(
                f"train_fn recorded {len(straight)} steps, fewer than steps={steps}"
            )
        _record_into(folder / "interrupted", train_fn, at, seed)
        saved = RunFolder(folder / "interrupted").checkpoints
        found = checkpoints.latest(saved)
        if found is None:
            raise AssertionError(
                f"no checkpoint was written when the run stopped after step {at}: train_fn must "
                "checkpoint through twice.Run (run.track(...)) or into twice.checkpoint_dir()"
            )
        resumed = _record_into(
            folder / "resumed",
            train_fn,
            steps,
            seed,
            **ChildSettings(resume_from=str(found), checkpoint_dir=str(saved)).to_env(),
        )
        check = compare_resumed(straight, resumed, at, {})
        if not check.identical:
            raise AssertionError(f"{check.verdict}: {check.cause}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
