"""Training loops the record tests share: a few steps of given models and optimizers under a
recorder installed for real, and a GradScaler loop."""

import json

import torch

from twice.record import hooks
from twice.store.traces import read_trace


def train(tmp_path, build, steps=4, name="run"):
    """Train `build()`'s (modules, optimizers, loss function) under a recorder; the trace's
    records."""
    torch.manual_seed(0)
    modules, optimizers, loss_of = build()
    hooks.install(hooks.Recorder(tmp_path / name))
    try:
        for step in range(steps):
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss_of(step).backward()
            for optimizer in optimizers:
                optimizer.step()
    finally:
        hooks.uninstall()
    return read_trace(tmp_path / name / "trace.jsonl")


def scaled_training(tmp_path, steps, loss_of, name="scaled", trace_every=1):
    """Train a Linear(4, 1) with SGD through torch.amp.GradScaler under a recorder: (records,
    scaler, events)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100, growth_interval=1000)
    updated = []
    recorder = hooks.install(hooks.Recorder(tmp_path / name, trace_every=trace_every))
    try:
        for step in range(steps):
            optimizer.zero_grad()
            scaler.scale(loss_of(model, step)).backward()
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            updated.append(
                scaler.get_scale() >= scale
            )  # the scale backs off exactly when the step was skipped
        assert recorder.step_index == steps
    finally:
        hooks.uninstall()
    events_file = tmp_path / name / "numerics.jsonl"
    events = (
        [json.loads(line) for line in events_file.read_text().splitlines()]
        if events_file.exists()
        else []
    )
    return read_trace(tmp_path / name / "trace.jsonl"), updated, events
