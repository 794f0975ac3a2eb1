"""record/stepchecks: the checks after each recorded step, the cheap numerics check (a
non-finite learning rate, a gradient explosion, a streak of skipped updates) named at its step."""

import pytest
import torch

from twice.record import hooks
from twice.record.stepchecks import PARAM_CHECK_EVERY, StepChecks
from unit.record.loops import scaled_training


@pytest.fixture
def recorder(tmp_path):
    rec = hooks.install(hooks.Recorder(tmp_path))
    yield rec
    hooks.uninstall()


@pytest.mark.parametrize("lr", [float("inf"), float("nan")])
def test_the_cheap_mode_flags_a_non_finite_learning_rate_and_a_gradient_explosion(recorder, lr):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, 4)
    for step in range(14):
        opt.zero_grad()
        scale = 1e6 if step == 12 else 1.0  # one step's gradients a million times the others'
        (scale * model(x).pow(2).mean()).backward()
        if step == 13:
            opt.param_groups[0]["lr"] = lr
        opt.step()
    recorder.finish()
    events = {(e.kind, e.step) for e in recorder.checks.health_log.log.events}
    assert ("grad_explosion", 12) in events and ("bad_scalar", 13) in events
    assert not any(kind in ("grad_explosion", "bad_scalar") and step < 12 for kind, step in events)


def test_a_long_streak_of_skipped_updates_is_a_health_event(tmp_path):
    """Gradients that are infinite at any scale: GradScaler skips every update and the model stops
    learning silently. The health log says so once the streak reaches 20 steps, naming them."""

    def loss_of(model, step):  # sqrt's gradient at 0 is infinite; the loss itself stays finite
        out = model(torch.ones(2, 4))
        return out.sum() + (out - out.detach()).sqrt().sum()

    records, updated, events = scaled_training(tmp_path, 24, loss_of)
    assert (
        all(r.skipped for r in records)
        and len({r.params for r in records}) == 1
        and not any(updated)
    )
    (event,) = [e for e in events if e["kind"] == "skipped_updates"]
    assert event["step"] == 19 and "20 consecutive recorded steps (0-19)" in event["summary"]
    assert not [e for e in events if e["kind"] == "non_finite"]
    # Recording one step in 3, the streak is of recorded steps, and the event names where it began.
    _, _, events = scaled_training(tmp_path, 60, loss_of, name="every3", trace_every=3)
    (event,) = [e for e in events if e["kind"] == "skipped_updates"]
    assert event["step"] == 57 and "(0-57)" in event["summary"]


def test_parameter_norms_are_checked_every_few_steps_and_not_at_all_without_health(tmp_path):
    checks = StepChecks(tmp_path)
    due = [step for step in range(40) if checks.param_norms_due(step)]
    assert due == list(range(0, 40, PARAM_CHECK_EVERY)) and PARAM_CHECK_EVERY > 1
    off = StepChecks(tmp_path, health=False)
    assert not any(off.param_norms_due(step) for step in range(40))
