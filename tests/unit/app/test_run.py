"""app/run (twice.Run): a loop recorded in its own run folder, seeded and deterministic, its
checkpoint resuming it where it stood."""

import pytest
import torch

from twice.app.run import Run, checkpoint_dir
from twice.store.runs import read_manifest
from twice.store.traces import read_trace

# warn mode says what a test process cannot fix (its hash seed): expected here
pytestmark = pytest.mark.filterwarnings("ignore:.*PYTHONHASHSEED was not fixed:RuntimeWarning")


def _train(tmp_path, name, steps=4, resume_from=None, checkpoint_at=None):
    with Run(runs_dir=tmp_path / "runs", name=name, determinism="warn", seed=7) as run:
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1)
        )
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        run.track(model=model, optimizer=optimizer)
        if resume_from is not None:
            assert run.resume(resume_from) == {} and run.step_index == checkpoint_at
        while run.step_index < steps:
            optimizer.zero_grad()
            model(torch.randn(5, 4)).pow(2).mean().backward()
            optimizer.step()
            if run.step_index == checkpoint_at and resume_from is None:
                run.checkpoint()
    return run, model


def test_a_seeded_loop_recorded_again_or_resumed_from_its_checkpoint_ends_the_same(tmp_path):
    straight, model_a = _train(tmp_path, "straight")
    trace = read_trace(straight.dir / "trace.jsonl")
    assert [r.step for r in trace] == [0, 1, 2, 3] and straight.step_index == 4
    manifest = read_manifest(straight.dir)
    assert manifest.context["status"] == "completed" and manifest.context["steps"] == 4
    assert manifest.seed == 7
    stopped, _ = _train(tmp_path, "stopped", steps=2, checkpoint_at=2)
    assert [r.params for r in read_trace(stopped.dir / "trace.jsonl")] == [
        r.params for r in trace[:2]
    ]  # the same seed, the same steps
    (saved,) = stopped.checkpoints_dir.iterdir()
    assert saved.name == "step-00000002"
    resumed, model_b = _train(tmp_path, "resumed", resume_from=saved, checkpoint_at=2)
    assert all(torch.equal(p, q) for p, q in zip(model_a.parameters(), model_b.parameters()))
    assert [r.params for r in read_trace(resumed.dir / "trace.jsonl")] == [
        r.params for r in trace[2:]
    ]


def test_a_hand_loop_records_its_steps_and_misuse_is_refused(tmp_path):
    w = torch.ones(3, requires_grad=True)
    with Run(runs_dir=tmp_path, determinism="warn") as run:
        for _ in range(2):
            loss = (w * 2).sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
            run.step(loss=loss, batch=torch.ones(3), params=[w])
            w.grad = None
    assert len(read_trace(run.dir / "trace.jsonl")) == 2
    with pytest.raises(RuntimeError, match="outside `with twice.Run"):
        Run().step(loss=1.0)
    with pytest.raises(ValueError, match="cannot start with '__'"):
        Run().track(__rng__=1)
    assert checkpoint_dir().name == "checkpoints"  # not under twice run
