"""record: the recorder's step records on real optimizers in this process (hooks installed for
real)."""

import torch

from twice.core.digests import digest, digest_pairs
from twice.record import hooks
from twice.record.recorder import Recorder
from twice.store.traces import read_trace
from unit.record.loops import scaled_training


def _params_digest(model):
    return digest_pairs([(name, digest(p)) for name, p in model.named_parameters()])


def test_models_trained_one_after_another_are_recorded_with_their_own_parameters(tmp_path):
    """A new model and optimizer per fold, in one process: an optimizer built where a freed one
    lived must not be recorded with the freed one's parameters (its id is the same)."""
    recorder = hooks.install(Recorder(tmp_path, params_every=1))
    expected = []
    try:
        for _fold in range(4):
            model = torch.nn.Linear(3, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                optimizer.zero_grad()
                model(torch.randn(5, 3)).sum().backward()
                optimizer.step()
                expected.append(_params_digest(model))
            del model, optimizer
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.step for r in records] == list(range(12)) and recorder.step_index == 12
    assert [r.params for r in records] == expected


def test_a_step_that_gradscaler_skips_is_still_a_step(tmp_path):
    """GradScaler skips optimizer.step() when the scaled gradients overflow (routine for the first
    fp16 steps): the iteration is still recorded as its own step, marked skipped, its parameters
    unchanged, and the overflow it handles is not reported as a numerical fault."""

    def loss_of(
        model, step
    ):  # a loss of 1 with gradients of ~1e10: they overflow float32 until the scale is below ~2^94
        out = model(torch.randn(8, 4) * 1e10).mean()
        return out - out.detach() + 1.0

    records, updated, events = scaled_training(tmp_path, 12, loss_of)
    assert [r.step for r in records] == list(range(12))  # one record per iteration, skipped or not
    skipped = [bool(r.skipped) for r in records]
    assert skipped == [not u for u in updated] and 3 <= sum(skipped) < 12 and skipped[0]
    first = skipped.index(False)
    assert (
        len({r.params for r in records[: first + 1]}) == 2
    )  # unchanged while skipped; changed by the first update
    # each step has its own loss and batch (the data its module was given), none merged
    assert all(r.loss and r.batch for r in records)
    assert len({r.batch for r in records}) == len(records)
    assert [e for e in events if e["kind"] in ("non_finite", "skipped_updates")] == []
    assert torch.amp.GradScaler.step.__name__ == "step" and not hasattr(
        torch.amp.GradScaler.step, "__wrapped__"
    )
