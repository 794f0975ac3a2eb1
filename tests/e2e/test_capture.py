"""Zero-code capture of unusual models: sparse gradients, parameters named alike, and a capture that
fails without taking the training down with it."""

import json
import math
import sys
import warnings

import pytest
import torch
from conftest import runs
from conftest import twice as twice_cli

import twice
from twice.core.fastpath import lanes_norm
from twice.record import hooks, norms
from twice.record.stepdata import StepData
from twice.store import layout
from twice.store.traces import read_trace

pytestmark = pytest.mark.filterwarnings("ignore:Sparse")


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


def sparse_model():
    embedding, head = torch.nn.Embedding(50, 4, sparse=True), torch.nn.Linear(4, 1)
    optimizers = [
        torch.optim.SparseAdam(embedding.parameters(), lr=0.01),
        torch.optim.SGD(head.parameters(), lr=0.1),
    ]
    return (
        [embedding, head],
        optimizers,
        lambda step: head(embedding(torch.randint(0, 50, (16,)))).pow(2).mean(),
    )


def test_sparse_gradients_are_traced_exactly(tmp_path):
    """nn.Embedding(sparse=True) gives sparse gradients: they are digested as their indices and
    values, the gradient norm counts duplicates summed, and two runs give the same trace."""
    first, second = train(tmp_path, sparse_model, name="a"), train(tmp_path, sparse_model, name="b")
    assert [r.step for r in first] == [0, 1, 2, 3]
    assert [(r.grads, r.params, r.grad_norm) for r in first] == [
        (r.grads, r.params, r.grad_norm) for r in second
    ]
    assert set(first[0].grad_digests) == {
        "weight",
        "Linear.weight",
        "Linear.bias",
    }  # named by the first optimizer, then distinct
    # The norm is the dense gradient's: compute it from the same step by hand.
    torch.manual_seed(0)
    (embedding, head), _, loss_of = sparse_model()
    loss_of(0).backward()
    dense = torch.cat(
        [p.grad.to_dense().reshape(-1) for p in (embedding.weight, head.weight, head.bias)]
    )
    assert abs(float.fromhex(first[0].grad_norm) - float(dense.norm())) < 1e-5 * float(dense.norm())


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
def test_a_sparse_digest_covers_its_indices_and_values(layout):
    dense = torch.zeros(4, 5)
    dense[0, 1], dense[2, 3], dense[3, 0] = 1.5, -2.0, 0.25
    make = {
        "coo": lambda t: t.to_sparse(),
        "csr": lambda t: t.to_sparse_csr(),
        "csc": lambda t: t.to_sparse_csc(),
    }[layout]
    sparse = make(dense)
    assert twice.digest(sparse) == twice.digest(make(dense.clone()))
    assert twice.digest(sparse) != twice.digest(dense)
    moved, changed = dense.clone(), dense.clone()
    moved[2, 3], moved[2, 4] = 0.0, -2.0
    changed[2, 3] = -2.5
    assert len({twice.digest(sparse), twice.digest(make(moved)), twice.digest(make(changed))}) == 3
    if layout == "coo":  # uncoalesced duplicates are what the tensor holds
        twice_one = torch.sparse_coo_tensor([[0, 0], [1, 1]], [1.0, 0.5], (4, 5))
        assert twice.digest(twice_one) != twice.digest(twice_one.coalesce())


def test_parameters_named_alike_in_separate_modules_get_distinct_names(tmp_path):
    """Two top-level modules both have a "weight": within one optimizer, and across a GAN's two."""

    def one_optimizer():
        a, b, c = (
            torch.nn.Linear(3, 3),
            torch.nn.Linear(3, 1),
            torch.nn.Sequential(torch.nn.Linear(3, 3)),
        )
        optimizer = torch.optim.SGD([*a.parameters(), *b.parameters(), *c.parameters()], lr=0.1)
        return [a, b, c], [optimizer], lambda step: b(a(c(torch.randn(4, 3)))).sum()

    records = train(tmp_path, one_optimizer, name="one")
    assert list(records[0].param_digests) == sorted(
        ["Linear.weight", "Linear.bias", "Linear#2.weight", "Linear#2.bias", "0.weight", "0.bias"]
    )

    def gan():
        d, g = torch.nn.Linear(2, 1), torch.nn.Linear(2, 2)
        optimizers = [
            torch.optim.SGD(d.parameters(), lr=0.1),
            torch.optim.SGD(g.parameters(), lr=0.1),
        ]
        return [d, g], optimizers, lambda step: d(g(torch.randn(4, 2))).mean()

    records = train(tmp_path, gan, name="gan")
    assert len(records[0].param_digests) == len(records[0].grad_digests) == 4
    assert set(records[0].param_digests) == {"weight", "bias", "Linear.weight", "Linear.bias"}


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_a_run_whose_capture_stopped_says_so_in_diff(tmp_path):
    (tmp_path / "late_meta.py").write_text(
        "import sys, torch\n"
        "model = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(6):\n"
        "    if step == 3 and sys.argv[1:] == ['meta']:\n"
        "        model = model.to('meta'); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    device = next(model.parameters()).device\n"
        "    opt.zero_grad(); model(torch.ones(2, 3, device=device)).sum().backward(); opt.step()\n"
        "print('trained to the end')\n"
    )
    whole = twice_cli("run", "--name", "whole", "--", sys.executable, "late_meta.py", cwd=tmp_path)
    cut = twice_cli(
        "run", "--name", "cut", "--", sys.executable, "late_meta.py", "meta", cwd=tmp_path
    )
    assert whole.returncode == 0 and cut.returncode == 0 and "trained to the end" in cut.stdout
    assert "step capture stopped at step 3" in cut.stderr
    a, b = runs(tmp_path)
    assert len(read_trace(b / "trace.jsonl")) == 3
    shown = twice_cli("diff", str(a), str(b), cwd=tmp_path)
    assert shown.returncode == 1
    assert (
        "B's step capture stopped at step 3 (TypeError: cannot digest a meta tensor" in shown.stdout
    )


def test_after_the_capture_stopped_a_step_limit_still_ends_the_run(tmp_path):
    """--max-steps (and so verify --steps and verify-resume) still stops the command where asked
    when the capture stopped before: the steps go on being counted, untraced."""
    (tmp_path / "meta20.py").write_text(
        "import torch\n"
        "model = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(20):\n"
        "    if step == 3:\n"
        "        model = model.to('meta'); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    device = next(model.parameters()).device\n"
        "    opt.zero_grad(); model(torch.ones(2, 3, device=device)).sum().backward(); opt.step()\n"
        "    print('finished step', step, flush=True)\n"
    )
    result = twice_cli("run", "--max-steps", "5", "--", sys.executable, "meta20.py", cwd=tmp_path)
    assert result.returncode == 0 and "step capture stopped at step 3" in result.stderr
    assert result.stdout.split("\n")[-2] == "finished step 4"


class Lookahead(torch.optim.Optimizer):
    """Lookahead (Zhang et al. 2019) as commonly written: a torch optimizer whose step() runs its
    base optimizer's step() and every k steps pulls slow weights towards the fast ones."""

    def __init__(self, base, k=2, alpha=0.5):
        self.base, self.k, self.alpha, self.count = base, k, alpha, 0
        super().__init__(base.param_groups, {})
        self.slow = [p.detach().clone() for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        self.base.step()
        self.count += 1
        if self.count % self.k == 0:
            for slow, fast in zip(
                self.slow, (p for group in self.param_groups for p in group["params"])
            ):
                slow.add_(fast - slow, alpha=self.alpha)
                fast.copy_(slow)


def lookahead_model():
    model = torch.nn.Linear(4, 3)
    return (
        [model],
        [Lookahead(torch.optim.SGD(model.parameters(), lr=0.1))],
        lambda step: model(torch.randn(8, 4)).pow(2).mean(),
    )


def test_an_optimizer_stepping_inside_another_is_part_of_its_step(tmp_path):
    """Lookahead's base optimizer steps inside Lookahead's step: one record per step, each gradient
    once, the norm the gradients' own, and the parameters those after Lookahead's pull."""
    records = train(tmp_path, lookahead_model, steps=4)
    assert [r.step for r in records] == [0, 1, 2, 3]
    torch.manual_seed(0)
    (model,), (optimizer,), loss_of = lookahead_model()
    for step, record in enumerate(records):
        optimizer.zero_grad()
        loss_of(step).backward()
        norms = [lanes_norm(p.grad) for p in (model.weight, model.bias)]
        assert record.grad_norm == math.sqrt(sum(n * n for n in norms)).hex()  # the two, once each
        assert record.grad_digests == {
            "weight": twice.digest(model.weight.grad),
            "bias": twice.digest(model.bias.grad),
        }
        optimizer.step()
        assert record.param_digests == {
            "weight": twice.digest(model.weight),
            "bias": twice.digest(model.bias),
        }


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


def test_a_compiled_optimizer_step_runs_twice_hooks_eagerly(tmp_path):
    """torch.compile(opt.step) makes Dynamo trace the global optimizer-step hooks: without care
    it traces into twice's digests and norms, breaking the user's graph at each of them and
    compiling twice's own functions as frames of their own (recompiled per tensor, until the
    recompile limit). twice's hooks run eagerly instead, outside Dynamo, and record the same
    steps."""
    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from twice.core import digests

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @torch.compile(backend="eager")
    def step():
        optimizer.step()

    hooks.install(hooks.Recorder(tmp_path / "run"))
    try:
        digests_by_hand = []
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            grads = {
                "weight": twice.digest(model.weight.grad),
                "bias": twice.digest(model.bias.grad),
            }
            step()
            digests_by_hand.append(
                (grads, {"weight": twice.digest(model.weight), "bias": twice.digest(model.bias)})
            )
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "run" / "trace.jsonl")
    assert not (tmp_path / "run" / layout.CAPTURE_ERROR).exists()
    assert [(r.grad_digests, r.param_digests) for r in records] == digests_by_hand
    for function in (digests.digest_tensor, norms.norms, StepData.take_params):
        assert _debug_get_cache_entry_list(function.__code__) == [], (
            function.__name__
        )  # never compiled by Dynamo
    torch._dynamo.reset()


_WRAPPED_PROBE = """
import sys, torch
from twice.record import hooks
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.Adam(model.parameters())  # imports torch._dynamo, as any optimizer does
assert "torch._dynamo" in sys.modules
if sys.argv[1] == "compiled-before":
    step = torch.compile(optimizer.step, backend="eager")
hooks.install(hooks.Recorder(sys.argv[2]))
print(hooks._Calls.compiled)
if sys.argv[1] == "compiled-after":
    step = torch.compile(optimizer.step, backend="eager")
    print(hooks._Calls.compiled)
hooks.uninstall()
"""


@pytest.mark.parametrize(
    "case, expected",
    [("eager", "False"), ("compiled-before", "True"), ("compiled-after", "False\nTrue")],
)
def test_the_handlers_are_wrapped_for_dynamo_only_once_the_program_compiles(
    tmp_path, case, expected
):
    """torch imports Dynamo for itself (building an optimizer does), so that is no sign of a
    compiling program: an eager one keeps plain handlers (the wrapper is a fifth of the tracing
    cost on a small CNN); torch.compile called before twice installs, or after, wraps them."""
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", _WRAPPED_PROBE, case, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


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
