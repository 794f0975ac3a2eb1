"""record/lifecycle: a process's steps numbered, every N-th traced, the stop after --max-steps
between two steps, and resuming at a checkpoint's step."""

import pytest
import torch

from twice.record import hooks
from twice.record.lifecycle import Lifecycle
from twice.record.recorder import Recorder
from twice.store.resumes import read_resume
from twice.store.traces import read_trace


def _steps(recorder, count, model=None):
    model = model or torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
    return model


def test_every_nth_step_is_traced_and_every_step_numbered(tmp_path):
    recorder = hooks.install(Recorder(tmp_path, trace_every=3))
    try:
        assert isinstance(recorder.life, Lifecycle)
        _steps(recorder, 7)
    finally:
        hooks.uninstall()
    assert [r.step for r in read_trace(tmp_path / "trace.jsonl")] == [0, 3, 6]
    assert recorder.step_index == 7


def test_the_run_stops_between_two_steps_after_the_step_limit(tmp_path):
    stopped = []
    recorder = hooks.install(Recorder(tmp_path, stop_after=2))
    recorder.on_stop.append(lambda: stopped.append(recorder.step_index))
    try:
        with pytest.raises(SystemExit) as leaving:
            _steps(recorder, 5)
    finally:
        hooks.uninstall()
    assert leaving.value.code == 0 and stopped == [2] and recorder.stopped
    assert recorder.rng_at_stop is not None  # the RNGs as the last step ended
    assert [r.step for r in read_trace(tmp_path / "trace.jsonl")] == [0, 1]


def test_a_resumed_process_numbers_from_the_checkpoints_step_and_says_where_from(tmp_path):
    recorder = hooks.install(Recorder(tmp_path))
    try:
        model = _steps(recorder, 2)
        recorder.resume_at(10, source=tmp_path / "checkpoints" / "step-00000010")
        _steps(recorder, 2, model)
    finally:
        hooks.uninstall()
    assert [r.step for r in read_trace(tmp_path / "trace.jsonl")] == [0, 1, 10, 11]
    resume = read_resume(tmp_path)
    assert resume.step == 10 and resume.name == "step-00000010"
