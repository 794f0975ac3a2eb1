"""Zero-code capture end to end: a capture that stopped, as diff and --max-steps see it, optimizer
steps under torch.compile, and sparse tensors' digests (the recorder's in-process tests:
tests/unit/record/)."""

import sys

import pytest
import torch
from conftest import runs
from conftest import twice as twice_cli

import twice
from twice.record import hooks, norms
from twice.record.stepdata import StepData
from twice.store import layout
from twice.store.traces import read_trace

pytestmark = pytest.mark.filterwarnings("ignore:Sparse")


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
