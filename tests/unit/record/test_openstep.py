"""record/openstep: the step in progress and the StepRecord it becomes."""

import math
import warnings

import torch

import twice
from twice.core.digests import digest_pairs, float_bits
from twice.record import hooks
from twice.record.openstep import StepRound
from twice.store.traces import read_trace


def test_a_round_becomes_the_record_of_its_step():
    round_ = StepRound(
        grads=[("w", "a" * 32), ("b", "b" * 32)],
        params=[("w", "c" * 32), ("b", "d" * 32)],
        grad_squares=[torch.tensor(3.0), 4.0],  # the gradients' norms
        param_squares=[[torch.tensor(1.0)], [2.0, 2.0]],  # per optimizer
        lr=[float_bits(0.1)],
        losses=[torch.tensor(0.25)],
        rng={"torch": "e" * 32},
    )
    record, losses = round_.record(step=7, per_tensor=True, elapsed=0.1234567)
    assert losses == [0.25] and record.loss == float_bits(0.25)
    assert record.step == 7 and record.time == 0.123457
    assert record.params == digest_pairs(round_.params) == round_.params_digest
    assert record.grads == digest_pairs(round_.grads) and record.grad_norm == float_bits(5.0)
    assert record.param_digests == {"w": "c" * 32, "b": "d" * 32}
    assert record.grad_digests == {"w": "a" * 32, "b": "b" * 32}
    assert round_.grad_norms == [3.0, 4.0] and round_.grad_total == 5.0
    assert round_.param_norm == math.hypot(1.0, math.sqrt(8.0))
    assert record.skipped is None and record.batch is None and record.rng == {"torch": "e" * 32}


def test_an_empty_round_records_nothing_but_its_step():
    record, losses = StepRound(skipped=True, losses=[1.0, 2.0]).record(0, False, 0.0)
    assert losses == [1.0, 2.0] and record.loss == [float_bits(1.0), float_bits(2.0)]
    assert record.grads is record.params is record.grad_norm is None
    assert record.param_digests is None and record.skipped is True


class Batch:
    """A user's batch class: tensors as attributes, as research code often collates them."""

    def __init__(self, x, y, tag=None):
        self.x, self.y, self.tag = x, y, tag


def test_batches_of_a_plain_class_are_digested_by_their_contents(tmp_path):
    """A collate_fn returning a plain object (not a tuple, dict or dataclass): its attributes are
    digested, so two steps with other data get other batch digests. An object twice cannot read
    (a compiled regex here) is identified by its type, and the run is warned once that a
    difference in it would go unseen."""
    import re

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(12, 3), torch.randn(12, 1))
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def collate(items):
        return Batch(
            torch.stack([x for x, _ in items]),
            torch.stack([y for _, y in items]),
            re.compile("opaque"),
        )

    hooks.install(hooks.Recorder(tmp_path / "run"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seen = []
            for batch in torch.utils.data.DataLoader(data, batch_size=4, collate_fn=collate):
                seen.append(twice.digest({"x": batch.x, "y": batch.y}))
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(batch.x), batch.y).backward()
                optimizer.step()
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "run" / "trace.jsonl")
    assert len(records) == 3 and len({r.batch for r in records}) == 3 and len(set(seen)) == 3
    opaque = [str(w.message) for w in caught if "cannot read" in str(w.message)]
    assert len(opaque) == 1 and "re.Pattern" in opaque[0]


def _digest(value) -> str:
    from twice.core.digests import Digester

    return Digester(strict=False).update(value).hexdigest()


class _Module:
    """A module as OpenStep sees one: an object it knows by identity."""


MODEL, TEACHER = _Module(), _Module()


def _steps(events) -> list:
    """The batch digests an OpenStep gives its rounds over `events`: ("batch", value), ("call",
    module, grad, value) for an outermost module call, ("end",) for a step's end (an optimizer
    step: the round takes what is pending)."""
    from twice.record.openstep import OpenStep

    step, out = OpenStep(), []
    for event in events:
        if event[0] == "batch":
            step.add_batch(event[1])
        elif event[0] == "end":
            round_ = StepRound()
            step.move_pending(round_)
            out.append(round_.batch.hexdigest() if round_.batch is not None else None)
        else:
            _, module, grad, value = event
            if not step.module_called(module, grad):
                step.inputs.enter((value,), {}, torch.Tensor, quiet=not grad)
                step.inputs.leave()
    return out


def test_the_step_batch_is_what_it_trained_on_whatever_it_evaluated_between():
    """Every loop shape, with or without a DataLoader for training, with a validation loader
    (after the step, or read with gradients on), a teacher called without gradients before the
    student: each step's batch is what it trained on, the same as without the evaluation."""
    import itertools

    train = [torch.full((3,), float(i)) for i in range(3)]
    val = [torch.full((3,), 10.0 + i) for i in range(2)]

    def loop(loader: bool, evaluation: str, teacher: bool) -> list:
        events = []
        for x in train:
            if loader:
                events.append(("batch", x))
            if teacher:
                events.append(("call", TEACHER, False, x))
            events += [("call", MODEL, True, x), ("end",)]
            if evaluation != "none":
                for v in val:
                    events += [("batch", v), ("call", MODEL, False, v)]
        return _steps(events)

    for loader, teacher in itertools.product((True, False), (False, True)):
        alone = loop(loader, "none", teacher)
        assert len(set(alone)) == 3 and None not in alone
        assert loop(loader, "validation", teacher) == alone, (loader, teacher)
    expected = [_digest(x) for x in train]
    assert loop(True, "none", True) == expected  # the teacher's call leaves the batch the step's


def test_a_step_with_nothing_else_takes_what_it_evaluated():
    # a step that only evaluates: its loader batch stands, then its calls' data
    assert _steps([("batch", torch.ones(2)), ("call", MODEL, False, torch.ones(2)), ("end",)]) == [
        _digest(torch.ones(2))
    ]
    assert _steps([("call", MODEL, False, torch.ones(2)), ("end",)]) == [_digest([torch.ones(2)])]
    # a loop whose model is no module: the batches no call came after are the step's
    assert _steps([("batch", torch.ones(2)), ("end",)]) == [_digest(torch.ones(2))]


def test_a_module_without_a_hash_is_known_by_identity():
    """A module class may define __eq__ (and so no __hash__): the trained modules are kept by
    identity, and a validation call of it still sets its batch aside."""

    class Unhashable(_Module):
        def __eq__(self, other):
            return True

    model, x, v = Unhashable(), torch.ones(2), torch.zeros(2)
    events = [("call", model, True, x), ("end",)]  # trained on tensors, no DataLoader
    events += [("batch", v), ("call", model, False, v)]  # a validation batch, then training
    events += [("call", model, True, x), ("end",)]
    assert _steps(events) == [_digest([x]), _digest([x])]
