"""record/hooks: torch's entry points patched to feed one recorder, and restored."""

import torch
from torch.utils.data import DataLoader, TensorDataset, dataloader

from twice.record import hooks
from twice.record.recorder import Recorder
from twice.store.traces import read_trace


def _entry_points():
    return (
        torch.autograd.backward,
        torch.nn.Module.__call__,
        torch.compile,
        torch.amp.GradScaler.step,
        dataloader._BaseDataLoaderIter.__next__,
    )


def test_install_feeds_the_recorder_and_uninstall_restores_torch(tmp_path):
    before = _entry_points()
    first = hooks.install(Recorder(tmp_path / "first"))
    recorder = hooks.install(Recorder(tmp_path / "run"))  # a second install replaces the first
    try:
        assert hooks.active_recorder() is recorder is not first
        assert all(now is not then for now, then in zip(_entry_points(), before))
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.arange(12.0).reshape(4, 3))
        for (x,) in DataLoader(data, batch_size=2):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    finally:
        hooks.uninstall()
    assert hooks.active_recorder() is None and _entry_points() == before
    records = read_trace(tmp_path / "run" / "trace.jsonl")
    assert [r.step for r in records] == [0, 1]
    assert all(r.batch and r.loss and r.grads and r.params for r in records)
    assert records[0].batch != records[1].batch
    assert read_trace(tmp_path / "first" / "trace.jsonl") == []


def test_outside_a_recorded_run_torch_runs_unwatched(tmp_path):
    hooks.uninstall()  # harmless with nothing installed
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    assert hooks.active_recorder() is None and model.weight.grad is not None


def test_the_step_dcp_takes_to_create_optimizer_state_is_not_a_training_step(tmp_path):
    """DCP's state-dict API gives a fresh optimizer its state by a step with zero gradients and a
    zero learning rate: the trace does not count it (a script loading DCP itself would otherwise
    record a step that is not one, and its resumed trace would not line up)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from twice.record import hooks
    from twice.record.recorder import Recorder

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    recorder = hooks.install(Recorder(tmp_path))
    try:
        get_optimizer_state_dict(model, opt)
        assert opt.state and recorder.completed_steps == 0  # the state made, no step counted
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        assert recorder.completed_steps == 1
    finally:
        hooks.uninstall()
