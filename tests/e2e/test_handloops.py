"""Loops that update parameters by hand (no torch.optim): their steps are found and judged."""

import json
import sys

import pytest
import torch
from conftest import runs, script, twice

from twice.core.fastpath import digest_many
from twice.store.traces import read_trace


def _run(folder, lr: str, mode: str, *options: str, changed: str | None = None):
    more = [changed] if changed is not None else []
    command = [sys.executable, "hand_loop.py", lr, mode, *more]
    result = twice("run", *options, "--", *command, cwd=folder)
    assert result.returncode == 0, result.stderr
    return runs(folder)[-1]


@pytest.mark.parametrize("mode", ["nograd", "data", "accum", "tensors"])
def test_hand_updated_steps_are_recorded_and_compare_bit_identical(tmp_path, mode):
    script("hand_loop.py", tmp_path)
    a = _run(tmp_path, "0.1", mode)
    saved = torch.load(tmp_path / "out.pt")
    records = read_trace(a / "trace.jsonl")
    assert [r.step for r in records] == list(range(6))
    losses_per_step = 2 if mode == "accum" else 1
    for record in records:
        losses = record.loss if isinstance(record.loss, list) else [record.loss]
        assert len(losses) == losses_per_step and record.grads and record.grad_norm
        assert record.params != records[0].params or record.step == 0  # the update is seen
    # "parameters after the update": the last step's digests are those of the saved tensors
    last = records[-1].param_digests
    names = ["w", "b"] if mode == "tensors" else list(saved)
    digests, _ = digest_many([saved[name] for name in names], False)
    expected = dict(zip(["tensor0", "tensor1"] if mode == "tensors" else names, digests))
    assert last == expected
    if mode in ("data", "accum"):  # two runs compared (nograd's pair is in the next test)
        b = _run(tmp_path, "0.1", mode)
        diff = twice("diff", a, b, cwd=tmp_path)
        assert diff.returncode == 0, diff.stdout
        assert "bit-identical: 6 steps compared" in diff.stdout


@pytest.mark.parametrize("mode", ["nograd", "data", "accum"])
def test_a_changed_batch_is_found_at_its_own_step(tmp_path, mode):
    """A hand loop's step ends inside the next step's first module call, after that call's
    inputs were read: each step's batch digest is still its own. Every mode, a batch changed
    at the first step, in the middle and at the last."""
    script("hand_loop.py", tmp_path)
    base = _run(tmp_path, "0.1", mode, changed="-1")
    for changed in (0, 3, 5):
        other = _run(tmp_path, "0.1", mode, changed=str(changed))
        diff = twice("diff", base, other, "--json", cwd=tmp_path)
        assert diff.returncode == 1, diff.stdout + diff.stderr
        found = json.loads(diff.stdout)["divergence"]
        assert found["step"] == changed and "batch" in found["fields"], found
    # every other step traced: a traced step after an untraced one still reads its batch
    base = _run(tmp_path, "0.1", mode, "--trace-every", "2", changed="-1")
    for changed in (2,):
        other = _run(tmp_path, "0.1", mode, "--trace-every", "2", changed=str(changed))
        diff = twice("diff", base, other, "--json", cwd=tmp_path)
        assert diff.returncode == 1, diff.stdout + diff.stderr
        found = json.loads(diff.stdout)["divergence"]
        assert found["step"] == changed and "batch" in found["fields"], found


def test_changed_learning_rate_is_found_at_the_first_step_down_to_the_op(tmp_path):
    script("hand_loop.py", tmp_path)
    a, b = _run(tmp_path, "0.1", "nograd"), _run(tmp_path, "0.2", "nograd")
    same = twice("diff", a, _run(tmp_path, "0.1", "nograd"), cwd=tmp_path)
    assert same.returncode == 0 and "bit-identical: 6 steps compared" in same.stdout
    diff = twice("diff", a, b, "--json", cwd=tmp_path)
    assert diff.returncode == 1
    found = json.loads(diff.stdout)
    assert found["divergence"]["step"] == 0 and "params" in found["divergence"]["fields"]
    assert "loss" not in found["divergence"]["fields"]  # the first loss came before any update
    located = twice("locate", a, b, cwd=tmp_path)
    assert located.returncode == 1, located.stdout + located.stderr
    assert "hand_loop.py:62" in located.stdout and "(0.1 vs 0.2)" in located.stdout


def test_verify_and_max_steps_work_on_a_hand_updated_loop(tmp_path):
    script("hand_loop.py", tmp_path)
    a = _run(tmp_path, "0.1", "data")
    verified = twice("verify", a, cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    short = _run(tmp_path, "0.1", "data", "--max-steps", "3")
    assert [r.step for r in read_trace(short / "trace.jsonl")] == [0, 1, 2]
    assert [r.params for r in read_trace(short / "trace.jsonl")] == [
        r.params for r in read_trace(a / "trace.jsonl")
    ][:3]


def test_a_run_without_any_step_is_not_judged_and_says_what_it_compared(tmp_path):
    script("hand_loop.py", tmp_path)
    a, b = _run(tmp_path, "0.1", "nostep"), _run(tmp_path, "0.1", "nostep")
    diff = twice("diff", a, b, cwd=tmp_path)
    assert diff.returncode == 2, diff.stdout  # cannot judge, never "runs differ"
    assert "no training step was recognised in A and B" in diff.stdout
    assert "0 backward calls, 0 optimizer steps" in diff.stdout
    assert "twice.Run.step" in diff.stdout
    assert "the manifests (identical)" in diff.stdout
    assert "files the runs wrote: 1 byte-identical" in diff.stdout
    payload = json.loads(twice("diff", a, b, "--json", cwd=tmp_path).stdout)
    assert payload["judged"] is False and payload["outputs"]["identical"] == ["out.pt"]
