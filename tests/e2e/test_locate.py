"""locate and audit end to end, with real processes (the op-log comparison on plain records is
tests/unit/core/test_opdiff.py)."""

import json
import sys

import pytest
from conftest import clean_env, runs, script, twice


def run_named(tmp, name, *args, env=None):
    result = twice("run", "--name", name, "--", sys.executable, *args, cwd=tmp, env=env)
    assert result.returncode == 0, result.stderr
    return next(r for r in runs(tmp) if r.name.endswith("-" + name))


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_audit_and_locate_name_the_noisy_module_its_op_and_line_and_nothing_else(tmp_path):
    script("noisy.py", tmp_path)
    audit = twice("audit", "--steps", "2", "--json", "--", sys.executable, "noisy.py", cwd=tmp_path)
    assert audit.returncode == 1
    found = json.loads(audit.stdout)["nondeterministic_here"]
    assert {(op["op"], op["module"], op["line"]) for op in found} == {
        ("aten::randn.generator", "Sequential.2", "noisy.py:8")
    }
    a, b = run_named(tmp_path, "a", "noisy.py"), run_named(tmp_path, "b", "noisy.py")
    located = twice("locate", a, b, "--json", cwd=tmp_path)
    assert located.returncode == 1
    report = json.loads(located.stdout)
    assert report["finding"]["kind"] == "operation"
    assert report["finding"]["a"]["op"] == "aten::randn.generator"
    assert (
        report["finding"]["a"]["module"] == "Sequential.2"
        and report["finding"]["a"]["line"] == "noisy.py:8"
    )


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_locate_names_the_thread_dependent_reduction_and_its_module(tmp_path):
    script("threads_module.py", tmp_path)
    one = run_named(tmp_path, "one", "threads_module.py", env=clean_env(OMP_NUM_THREADS="1"))
    two = run_named(tmp_path, "two", "threads_module.py", env=clean_env(OMP_NUM_THREADS="2"))
    result = twice("locate", one, two, cwd=tmp_path)
    assert result.returncode == 1
    sentence = result.stdout.splitlines()[0]
    assert sentence.startswith("step 0: aten::sum")
    assert "in Reduce" in sentence and "threads_module.py:10" in sentence
    assert "from identical inputs" in sentence and "ulps" in sentence


def test_locate_says_the_first_difference_is_the_input_batch_when_only_data_differ(tmp_path):
    script("data_arg.py", tmp_path)
    a, b = (
        run_named(tmp_path, "d1", "data_arg.py", "1"),
        run_named(tmp_path, "d2", "data_arg.py", "2"),
    )
    result = twice("locate", a, b, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.startswith(
        "step 0: the first difference is the input batch (data), not an operation"
    )


def test_locate_on_identical_runs_finds_nothing(tmp_path):
    script("data_arg.py", tmp_path)
    a, b = (
        run_named(tmp_path, "x", "data_arg.py", "1"),
        run_named(tmp_path, "y", "data_arg.py", "1"),
    )
    result = twice("locate", a, b, cwd=tmp_path)
    assert result.returncode == 0 and "nothing to locate" in result.stdout


def test_record_ops_writes_the_op_log_of_chosen_steps_only(tmp_path):
    script("data_arg.py", tmp_path)
    result = twice(
        "run", "--record-ops", "1", "--", sys.executable, "data_arg.py", "1", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    from twice.store.oplogs import recorded_steps, step_ops

    run_dir = runs(tmp_path)[0]
    assert sorted(p.name for p in (run_dir / "ops").iterdir()) == ["ops.jsonl"]
    assert recorded_steps(run_dir) == [1] and step_ops(run_dir, 0) is None
    records = step_ops(run_dir, 1)
    phases = {r["phase"] for r in records}
    assert {"forward", "backward", "optimizer"} <= phases
    addmm = next(r for r in records if r["op"] == "aten::addmm")
    assert addmm["module"] == "Sequential.0" and addmm["line"].startswith("data_arg.py:")
    bad = twice("run", "--record-ops", "x", "--", sys.executable, "data_arg.py", "1", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith(
        "error: --record-ops 'x' is not a list of steps"
    )


def test_the_compiler_guard_is_skipped_only_for_one_step_modes_while_nothing_is_compiled():
    import subprocess

    # A fresh process: whether anything was compiled is process-wide.
    code = """
import torch
from twice.record.oplog import OpContext, OpRecorder
print("__torch_dispatch__" in vars(OpRecorder(0)), "__torch_dispatch__" in vars(OpContext(0)))
torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))
recorder = OpRecorder(1)
with recorder:
    torch.ones(2).mul(3)
print("__torch_dispatch__" in vars(recorder), [r["op"] for r in recorder.records])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True False", "False ['aten::ones', 'aten::mul.Tensor']"]


def test_an_op_log_cut_short_by_a_kill_reads_as_not_recorded(tmp_path):
    from twice.record.oplog import OpLog
    from twice.store.oplogs import step_ops

    log = OpLog(tmp_path)
    record = {
        "i": 0,
        "op": "aten::mul.Tensor",
        "phase": "forward",
        "in": ["a"],
        "out": ["b"],
        "shapes": [[2]],
        "dtypes": ["float32"],
        "module": None,
        "line": "x.py:1",
    }
    log.append(3, [record, dict(record, i=1)])
    log.append(4, [record, dict(record, i=1)])
    log.close()
    assert step_ops(tmp_path, 3) == [record, dict(record, i=1)] and step_ops(tmp_path, 5) is None
    text = log.path.read_text()
    for cut in (len(text) - 1, len(text) - 20, text.rindex('{"step":4') + 30):
        log.path.write_text(text[:cut])
        assert step_ops(tmp_path, 4) is None and step_ops(tmp_path, 3) == [
            record,
            dict(record, i=1),
        ], cut
    legacy = tmp_path / "old"
    (legacy / "ops").mkdir(parents=True)
    (legacy / "ops" / "step-2.jsonl").write_text(json.dumps(record) + "\n")
    assert step_ops(legacy, 2) == [record]  # op logs of earlier versions still read


@pytest.mark.slow
def test_bisection_finds_the_step_full_tracing_finds_in_log2_replays(tmp_path):
    import math

    script("late_reduction.py", tmp_path)
    envs = {"1": clean_env(OMP_NUM_THREADS="1"), "2": clean_env(OMP_NUM_THREADS="2")}
    full = [run_named(tmp_path, f"full{t}", "late_reduction.py", env=envs[t]) for t in ("1", "2")]
    diff = json.loads(twice("diff", *full, "--json", cwd=tmp_path).stdout)
    expected = diff["divergence"]["step"]
    coarse = []
    for t in ("1", "2"):
        result = twice(
            "run",
            "--trace-every",
            "16",
            "--name",
            f"coarse{t}",
            "--",
            sys.executable,
            "late_reduction.py",
            cwd=tmp_path,
            env=envs[t],
        )
        assert result.returncode == 0
        coarse.append(next(r for r in runs(tmp_path) if r.name.endswith(f"-coarse{t}")))
    found = twice("bisect", *coarse, "--json", cwd=tmp_path)
    report = json.loads(found.stdout)
    assert found.returncode == 1 and report["step"] == expected
    low, high = report["interval"]
    assert report["replays"] <= math.ceil(math.log2(high - low)) + 2


def test_audit_passes_a_cpu_run_with_cuda_only_hazards_and_lists_every_call_site(tmp_path):
    """An embedding model on the CPU: nothing differed, so the gate passes; the CUDA hazard is
    listed with both lines that ran it, and --for cuda fails on it."""
    script("embeddings.py", tmp_path)
    here = twice("audit", "--json", "--", sys.executable, "embeddings.py", cwd=tmp_path)
    assert here.returncode == 0, here.stdout + here.stderr
    report = json.loads(here.stdout)
    assert report["nondeterministic_here"] == []
    sites = report["cuda_nondeterministic"]["aten::embedding_dense_backward"]["sites"]
    assert {site["line"] for site in sites} >= {"embeddings.py:9", "embeddings.py:10"}, sites
    cuda = twice("audit", "--for", "cuda", "--", sys.executable, "embeddings.py", cwd=tmp_path)
    assert cuda.returncode == 1
    assert "fails this audit (--for cuda)" in cuda.stdout and "embeddings.py:10" in cuda.stdout
