"""app.render: what the commands print, held byte for byte (golden strings), without a terminal."""

from pathlib import Path

from twice.app.compare import Comparison
from twice.app.render import (
    format_bisect,
    format_checkpoint,
    format_comparison,
    format_nan,
    format_resume_check,
    format_run,
    format_trace_cost_note,
    format_verify,
)
from twice.app.verify import ResumeCheck
from twice.core.divergence import Divergence
from twice.core.manifest import Difference


def _comparison(identical=False, differences=(), divergence=None):
    return Comparison(
        a=Path("runs/a"),
        b=Path("runs/b"),
        identical=identical,
        verdict="runs are bit-identical: 5 steps compared" if identical else "runs differ: step 3",
        explanation="same code, seeds and settings",
        differences=list(differences),
        divergence=divergence,
        steps={"main": (5, 5)},
        statuses=("completed", "completed"),
    )


def test_a_difference_prints_the_verdict_then_the_cause_the_manifest_groups_and_the_divergence():
    divergence = Divergence(
        "main",
        3,
        ["loss", "grads", "params"],
        tensors={"grads": ["fc.weight", "fc.bias"]},
        loss_a="0x1.0p+0",
        loss_b="0x1.000002p+0",
    )
    diffs = [Difference("threads", "threads.intra_op_threads", 1, 2)]
    assert format_comparison(_comparison(differences=diffs, divergence=divergence)) == (
        "runs differ: step 3\n"
        "cause: same code, seeds and settings\n"
        "\n"
        "identity differences (A -> B):\n"
        "  threads:\n"
        "    threads.intra_op_threads: 1 -> 2\n"
        "\n"
        "first divergence: step 3, in causal order:\n"
        "  loss (forward): 0x1.0p+0 vs 0x1.000002p+0 (abs 1.19e-07, 1 ulps)\n"
        "  gradients (backward): fc.weight, fc.bias\n"
        "  parameters (update)\n"
        "\n"
        "recorded steps: main: A 5 / B 5; status: A completed, B completed"
    )


def test_a_group_of_more_than_twelve_differences_shows_the_first_twelve_and_the_count():
    diffs = [Difference("packages", f"packages.p{i:02d}", "1", "2") for i in range(14)]
    text = format_comparison(_comparison(identical=True, differences=diffs))
    assert "note: same code, seeds and settings" in text
    assert "  packages: (14, first 12 shown)" in text
    assert "packages.p11" in text and "packages.p12" not in text


def test_verify_prints_reproducible_before_the_comparison_and_colour_only_when_asked():
    plain = format_verify(_comparison(identical=True))
    assert plain.splitlines()[:2] == ["reproducible", "runs are bit-identical: 5 steps compared"]
    assert "\x1b[" not in plain and "\x1b[" in format_verify(
        _comparison(identical=True), color=True
    )


def test_the_trace_cost_note_appears_only_past_both_thresholds():
    cost = {"share": 0.2, "hooks_s": 3.0, "wall_s": 15.0}
    assert format_trace_cost_note({"trace_cost": cost}, 1) == (
        "twice: tracing took 20% of the run's time (3.0 s in twice's hooks over 15.0 s); "
        "--trace-every 10 would trace one step in 10"
    )
    assert format_trace_cost_note({"trace_cost": {**cost, "share": 0.01}}, 1) is None
    assert format_trace_cost_note({"trace_cost": {**cost, "hooks_s": 0.5}}, 1) is None
    assert format_trace_cost_note({}, 1) is None


def test_one_run_shows_its_command_seed_steps_and_environment():
    row = {
        "id": "20261203-a",
        "status": "completed",
        "exit_code": 0,
        "steps": 12,
        "seed": 0,
        "started": None,
        "command": "python train.py",
    }
    identity = {
        "determinism": {"mode": "strict"},
        "python": {"version": "3.11.7"},
        "torch": {"version": "2.13.0"},
        "packages": {"a": "1"},
        "code": {"sources": {"x": 1}},
    }
    assert format_run(row, identity) == (
        "run 20261203-a: completed (exit 0)\n"
        "  command: python train.py\n"
        "  seed: 0, determinism: strict\n"
        "  steps recorded: 12\n"
        "  sources: 1 local files digested\n"
        "  python 3.11.7, torch 2.13.0, 1 packages"
    )


def test_nan_tells_the_fault_and_its_chain_or_the_first_non_finite_step_or_none():
    report = {
        "fault": {
            "value": "nan",
            "step": 4,
            "op": "aten::div.Tensor",
            "phase": "user",
            "line": "train.py:9",
        },
        "chain": [
            {"step": 0, "summary": "softmax saturated", "module": "head", "fix": "lower the lr"},
            {"step": 4, "summary": "first nan produced by aten::div.Tensor", "line": "train.py:9"},
        ],
    }
    assert format_nan(report, []) == (
        "nan at step 4: aten::div.Tensor (user) at train.py:9\n"
        "chain of causes, first cause first:\n"
        "  1. step 0: softmax saturated in head\n"
        "     fix: lower the lr\n"
        "  2. step 4: first nan produced by aten::div.Tensor at train.py:9"
    )
    events = [{"kind": "non_finite", "step": 44, "summary": "loss is inf at step 44"}]
    assert format_nan(None, events) == (
        "non-finite values recorded from step 44: loss is inf at step 44\n"
        "(run with `twice run --numerics` to find the operation and line)"
    )
    assert format_nan(None, []) == "no NaN or Inf recorded; 0 warnings"


def test_resume_checks_bisection_and_checkpoints():
    check = ResumeCheck(
        False, "resume differs", "the RNG was not restored", 5, {"straight": "runs/a"}, None
    )
    assert (
        format_resume_check(check)
        == "resume differs\ncause: the RNG was not restored\n  straight: runs/a"
    )
    assert format_bisect(type("B", (), {"step": None})()) == "runs do not diverge"
    found = type("B", (), {"step": 7, "interval": (5, 10), "replays": 3})()
    assert (
        format_bisect(found)
        == "first divergence at step 7 (between recorded steps 5 and 10; 3 replays)"
    )
    from twice.checkpoint.index import CheckpointIndex, RanksIndex

    assert format_checkpoint("c", CheckpointIndex({"opt": None, "model": None}, {})) == (
        "checkpoint c: valid (model, opt)"
    )
    parts = RanksIndex(2, {"rank-00000": "0" * 32, "rank-00001": "0" * 32})
    assert format_checkpoint("c", parts) == "checkpoint c: valid, 2 rank parts"
