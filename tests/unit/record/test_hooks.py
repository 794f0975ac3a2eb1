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
