"""Numerical health through real runs: the NaN's real origin and the causes before it, as run,
ls, show, verify and nan say them (the watch and the checks in-process: tests/unit/record/)."""

import json
import math
import subprocess
import sys

from conftest import clean_env, runs, script, twice

from twice.core.errors import Exit
from twice.store.traces import read_trace


def test_gradient_normalisation_nan_is_traced_to_its_line_with_saturation_and_zero_gradients(
    tmp_path,
):
    script("gradnorm.py", tmp_path)
    result = twice("run", "--numerics", "--", sys.executable, "gradnorm.py", cwd=tmp_path)
    # One clear line and exit 4 (Exit.NUMERICS), not a traceback through the dispatch machinery.
    assert result.returncode == Exit.NUMERICS == 4 and "Traceback" not in result.stderr, (
        result.stderr
    )
    assert "twice: stopped at step " in result.stderr and "`twice nan " in result.stderr
    events = (runs(tmp_path)[0] / "numerics.jsonl").read_text().splitlines()
    assert len(events) == len(set(events))  # no event written twice
    shown = twice("nan", runs(tmp_path)[0], "--json", cwd=tmp_path)
    assert shown.returncode == 1
    report = json.loads(shown.stdout)["report"]
    fault = report["fault"]
    assert fault["value"] == "NaN" and fault["op"] == "aten::div_.Tensor"
    assert fault["phase"] == "user" and fault["line"] == "gradnorm.py:19"  # p.grad /= p.grad.norm()
    kinds = [event["kind"] for event in report["chain"]]
    assert kinds[0] == "saturation" and kinds[-1] == "non_finite"  # first cause first
    saturation = report["chain"][0]
    assert "softmax" in saturation["summary"] and saturation["last_step"] == fault["step"]
    zero = next(e for e in report["chain"] if e["kind"] == "zero_grad")
    assert zero["step"] == fault["step"] and "0.weight" in zero["details"]["parameters"]
    assert any(
        e["kind"] == "div_by_zero" and e["line"] == "gradnorm.py:19" for e in report["chain"]
    )
    text = twice("nan", runs(tmp_path)[0], cwd=tmp_path).stdout
    assert text.startswith(
        f"NaN at step {fault['step']}: aten::div_.Tensor (user) at gradnorm.py:19"
    )
    # The whole story in the script's own words: vanishing gradients, then 0/0 at its line.
    assert "the gradients of `0.weight`, `0.bias`" in text and "norm underflows to 0" in text
    assert "`p.grad.norm()` is zero and `p.grad` holds" in text and "0/0 is NaN" in text
    assert "input 0 (`p.grad`)" in text and "input 1 (`p.grad.norm()`): all zero" in text
    # What detect_anomaly says about the same script: a backward function, one step later.
    anomaly = subprocess.run(
        [sys.executable, "gradnorm.py", "anomaly"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert "Function 'LogSoftmaxBackward0' returned nan values" in anomaly.stderr
    assert "gradnorm.py:19" not in anomaly.stderr.splitlines()[-1]


def test_the_cheap_mode_records_the_bad_step_without_being_asked(tmp_path):
    script("gradnorm.py", tmp_path)
    assert twice("run", "--", sys.executable, "gradnorm.py", cwd=tmp_path).returncode == 0
    run = runs(tmp_path)[0]
    events = [json.loads(line) for line in (run / "numerics.jsonl").read_text().splitlines()]
    first_bad = next(e for e in events if e["kind"] == "non_finite")
    # The step depends on the CPU's kernels (79 with AVX2, 90 with AVX-512): the one whose
    # normalisation divided 0 by 0, so the step before the first NaN loss in the trace.
    losses = [
        float.fromhex(r.loss) if not r.loss.startswith("nan") else math.nan
        for r in read_trace(run / "trace.jsonl")
    ]
    bad = next(step for step, loss in enumerate(losses) if math.isnan(loss))
    assert (
        bad > 20 and first_bad["step"] == bad - 1 and "gradients non-finite" in first_bad["summary"]
    )
    shown = twice("nan", run, cwd=tmp_path)
    assert (
        shown.returncode == 1 and f"non-finite values recorded from step {bad - 1}" in shown.stdout
    )


def test_a_loss_gone_non_finite_is_named_by_run_ls_show_verify_and_nan(tmp_path):
    """Recorded without --numerics: the trace's losses alone say where the run went non-finite."""
    script("goes_inf.py", tmp_path)
    result = twice("run", "--", sys.executable, "goes_inf.py", cwd=tmp_path)
    phrase = "loss non-finite from step 4 (inf), NaN from step 5"
    assert (
        result.returncode == 0 and f"completed (exit 0); {phrase}: see `twice nan" in result.stderr
    )
    run = runs(tmp_path)[-1]
    assert phrase in twice("ls", cwd=tmp_path).stdout
    assert f"{phrase}: see `twice nan {run.name}`" in twice("show", run.name, cwd=tmp_path).stdout
    nan = twice("nan", run.name, cwd=tmp_path)
    assert nan.returncode == 1 and "run with `twice run --numerics`" in nan.stdout
    assert phrase in nan.stdout or "non-finite values recorded from step 4" in nan.stdout
    verify = twice("verify", run.name, "-q", cwd=tmp_path)
    assert verify.returncode == 0 and f"note: the run's {phrase}" in verify.stdout


DEAD_RELU = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
with torch.no_grad():
    model[0].bias.fill_(-100.0)  # every unit dead: no gradient reaches layer 0
x = torch.randn(16, 4)
for step in range(3):
    model.zero_grad()
    model(x).pow(2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            g = p.grad.div(p.grad.norm())
            p -= 0.1 * g
"""


def test_exactly_zero_gradients_are_named_with_the_division_that_reads_them(tmp_path):
    (tmp_path / "dead.py").write_text(DEAD_RELU)
    result = twice("run", "--numerics", "--", sys.executable, "dead.py", cwd=tmp_path)
    assert result.returncode == Exit.NUMERICS, result.stderr
    text = twice("nan", runs(tmp_path)[0], cwd=tmp_path).stdout
    assert (
        "the gradients of `0.bias`, `0.weight` and `2.weight` are exactly zero at step 0 "
        "(every element)" in text
    ), text
    assert "`p.grad.norm()` is zero and `p.grad` is all zero: 0/0 is NaN at dead.py:13" in text
