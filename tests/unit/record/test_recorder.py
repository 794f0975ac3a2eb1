"""record: the recorder's step records on real optimizers in this process (hooks installed for
real)."""

import pytest
import torch

from twice.core.digests import digest, digest_pairs
from twice.record import hooks
from twice.record.names import ParamNames
from twice.record.oplog import OpLog, OpRecorder
from twice.record.recorder import Recorder
from twice.store.oplogs import step_ops
from twice.store.traces import read_trace


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


@pytest.mark.slow
def test_a_new_optimizer_at_a_freed_ones_address_is_named_with_its_own_parameters():
    names, seen, reused = ParamNames(), set(), 0
    for _ in range(200):
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        reused += id(optimizer) in seen
        seen.add(id(optimizer))
        pairs = names.of(optimizer)
        assert [name for name, _ in pairs] == ["weight", "bias"]
        assert all(p is q for (_, p), q in zip(pairs, [model.weight, model.bias], strict=True))
        del model, optimizer, pairs
    assert reused, "CPython reused no optimizer's address: the case was not exercised"
    assert names.all() == []  # every optimizer was freed, and with it what it named


def test_a_gan_round_of_two_optimizers_is_one_step(tmp_path):
    torch.manual_seed(0)
    g, d = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
    hooks.install(Recorder(tmp_path))
    try:
        for _ in range(4):
            for opt in (opt_d, opt_g):
                opt.zero_grad()
                d(g(torch.randn(3, 2))).sum().backward()
                opt.step()
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.step for r in records] == [0, 1, 2, 3]


def _record_ops(folder, step=0):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
    with OpRecorder(step) as ops:
        model(torch.ones(4, 3)).sum().backward()
    log = OpLog(folder)
    ops.close()
    ops.write(log)
    log.close()


def test_op_logs_name_a_new_models_modules_right_in_the_same_process(tmp_path):
    """Module paths are cached by id: a model built where a freed one lived must not inherit its
    names (the Linear was once named after the freed model's Tanh)."""
    for attempt in range(5):
        torch.manual_seed(0)
        _record_ops(tmp_path / f"{attempt}a")
        torch.manual_seed(0)
        _record_ops(tmp_path / f"{attempt}b")
        for side in "ab":
            records = step_ops(tmp_path / f"{attempt}{side}", 0)
            assert {r["module"] for r in records if r["op"] == "aten::addmm"} == {"Sequential.0"}
            assert {r["module"] for r in records if r["op"] == "aten::tanh"} == {"Sequential.1"}
