"""record/health: numerical health events, their log (numerics.jsonl, once per key) and the chain
of causes before a fault, and the cheap checks every traced step runs."""

import json
import math

from twice.core.digests import float_bits
from twice.record.health import FIXES, Event, HealthLog, StepHealth
from twice.store.layout import RunFolder


def test_an_event_carries_the_fix_for_its_kind():
    event = Event("log_of_zero", 3, "log of zero", op="aten::log", line="train.py:4")
    entry = event.to_json()
    assert entry["fix"] == FIXES["log_of_zero"] and entry["step"] == 3
    assert entry["line"] == "train.py:4" and entry["details"] == {}
    assert Event("no_such_kind", 0, "x").to_json()["fix"] is None


def test_the_log_writes_each_event_once_per_key(tmp_path):
    log = HealthLog(tmp_path)
    log.add(Event("saturation", 1, "tanh saturated", op="aten::tanh"))
    log.add(Event("saturation", 1, "tanh saturated", op="aten::tanh"))  # the same key: once
    log.add(Event("saturation", 2, "tanh saturated", op="aten::tanh"))
    lines = RunFolder(tmp_path).numerics_events.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2] and len(log.events) == 2
    HealthLog(None).add(Event("saturation", 1, "no folder: kept in memory only"))


def test_the_chain_puts_the_first_cause_first_and_the_fault_last():
    log = HealthLog(None)
    log.add(Event("zero_grad", 4, "gradients exactly zero: w", module="M"))
    log.add(Event("saturation", 2, "saturated: 97% at the limit", op="aten::tanh"))
    log.add(Event("saturation", 5, "saturated: 99% at the limit", op="aten::tanh"))
    log.add(Event("exp_overflow", 9, "after the fault", op="aten::exp"))
    fault = Event("non_finite", 6, "NaN")
    chain = log.chain(fault)
    assert [entry["kind"] for entry in chain] == ["saturation", "zero_grad", "non_finite"]
    assert chain[0]["step"] == 2 and chain[0]["last_step"] == 5
    assert chain[0]["summary"].endswith("(from step 2 on; at step 5: 99% at the limit)")


def _check(health, step, losses=(1.0,), norms=(1.0,), skipped=False, lr=(0.1,), params=1.0):
    grads = [(f"p{i}", "d") for i in range(len(norms))]
    total = math.sqrt(sum(n * n for n in norms)) if norms else None
    lrs = [float_bits(x) for x in lr]
    health.check(step, list(losses), grads, list(norms), total, skipped, lrs, params)


def _kinds(health):
    return [(e.kind, e.step) for e in health.log.events]


def test_the_step_checks_name_what_went_wrong_at_the_step_it_did():
    health = StepHealth(None)
    for step in range(12):
        _check(health, step)
    assert _kinds(health) == []  # a healthy run: nothing
    _check(health, 12, norms=(3e3, 1e3))
    _check(health, 13, lr=(math.inf,))
    _check(health, 14, losses=(math.nan,))
    _check(health, 15, losses=(0.0,), norms=(0.0, 2.0))
    _check(health, 16, params=math.inf)
    _check(health, 17, norms=(math.inf,))
    assert _kinds(health) == [
        ("grad_explosion", 12),
        ("bad_scalar", 13),
        ("non_finite", 14),
        ("loss_zero", 15),
        ("zero_grad", 15),
        ("non_finite", 16),
        ("non_finite", 17),
    ]
    assert health.log.events[4].details == {"parameters": ["p0"]}


def test_skipped_updates_are_an_event_only_after_a_long_streak():
    health = StepHealth(None)
    for step in range(19):
        _check(health, step, norms=(math.inf,), skipped=True)  # GradScaler's routine skips
    _check(health, 19, norms=(1.0,))  # an update: the streak starts again
    for step in range(20, 40):
        _check(health, step, norms=(math.inf,), skipped=True)
    ((kind, step),) = _kinds(health)
    assert (kind, step) == ("skipped_updates", 39)
    assert "20 consecutive recorded steps (20-39)" in health.log.events[0].summary
