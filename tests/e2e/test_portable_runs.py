"""`twice run --portable` through real processes: an MLP, a CNN with batch norm and a transformer
with dropout, trained with SGD, Adam and AdamW, and an LSTM language model, a DCGAN, a VAE, a
ResNet-style CNN and a bfloat16-autocast MLP with Adam, give byte-identical parameters, losses and
traces at 1 and 2 threads, under every instruction set torch can be held to here, and with
MKL_CBWR set or not; the same runs without --portable do not. And the policies for uncovered ops,
end to end."""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import clean_env, runs, script, twice


def _capabilities() -> list[str]:
    """ATEN_CPU_CAPABILITY values this CPU can run."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    found = ["default"]
    if " avx2" in flags:
        found.append("avx2")
    if " avx512f" in flags and " avx512bw" in flags:
        found.append("avx512")
    return found


def _variants() -> list[dict[str, str]]:
    caps = _capabilities()
    variants = [
        {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"},
        {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": caps[-1]},
        {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": caps[-1], "MKL_CBWR": "COMPATIBLE"},
    ]
    variants += [{"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": c} for c in caps[1:]]
    return variants


def _run(folder: Path, env: dict[str, str], portable: bool, name: str):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.parent / "portable_models.py"  # one path: the runs' command lines are equal
    flags = ["--portable"] if portable else []
    result = twice(
        "run", *flags, "--name", name, "--", sys.executable, path,
        cwd=folder, env=clean_env(**env), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((folder / "portable.json").read_text()), runs(folder)[-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every variant with --portable, and the first and second without, two at a time."""
    base = tmp_path_factory.mktemp("portable")
    script("portable_models.py", base)
    jobs = [(base / f"p{i}", env, True, f"p{i}") for i, env in enumerate(_variants())]
    jobs += [(base / f"plain{i}", env, False, f"plain{i}") for i, env in enumerate(_variants()[:2])]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda job: _run(*job), jobs))
    portable = done[: len(jobs) - 2]
    return {"portable": portable, "plain": done[-2:], "base": base}


def test_portable_bits_do_not_depend_on_threads_instruction_set_or_blas(trained):
    first, first_run = trained["portable"][0]
    assert set(first) == {
        f"{m}/{o}" for m in ("mlp", "cnn", "transformer") for o in ("sgd", "adam", "adamw")
    } | {f"{m}/adam" for m in ("lstm", "dcgan", "vae", "resnet", "bf16")}
    for results, run_dir in trained["portable"][1:]:
        assert results == first  # losses' bits and the final parameters' digests
        compared = twice("diff", first_run, run_dir, cwd=trained["base"])
        assert compared.returncode == 0, compared.stdout
        assert "bit-identical" in compared.stdout


def test_the_same_runs_without_portable_differ(trained):
    (a, a_dir), (b, b_dir) = trained["plain"]
    assert a != b  # the proof above could fail: these settings do change torch's bits
    compared = twice("diff", a_dir, b_dir, cwd=trained["base"])
    assert compared.returncode == 1
    assert "--portable" in compared.stdout  # the cause sentence names the way out


def test_portable_manifest_records_the_mode(trained):
    _, run_dir = trained["portable"][0]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["identity"]["determinism"]["portable"] is True
    assert "portable_uncovered" not in manifest["context"]


def test_uncovered_ops_under_each_policy(tmp_path):
    path = script("portable_uncovered.py", tmp_path)
    strict = twice("run", "--portable", "--", sys.executable, path, cwd=tmp_path)
    assert strict.returncode != 0
    assert "aten::linalg_eig" in strict.stderr and "portable_uncovered.py:10" in strict.stderr
    warn = twice(
        "run", "--portable", "--determinism", "warn", "--", sys.executable, path, cwd=tmp_path
    )
    assert warn.returncode == 0 and "aten::linalg_eig" in warn.stderr
    manifest = json.loads((runs(tmp_path)[-1] / "manifest.json").read_text())
    listed = manifest["context"]["portable_uncovered"]
    ops = {e["op"]: e for e in listed}
    assert list(ops) == ["aten::linalg_eig.default"], ops
    forward = ops["aten::linalg_eig.default"]
    assert forward["line"] == "portable_uncovered.py:10" and forward["count"] >= 2


def test_audit_portable_lists_what_is_not_covered(tmp_path):
    path = script("portable_uncovered.py", tmp_path)
    found = twice("audit", "--portable", "-q", "--", sys.executable, path, cwd=tmp_path)
    assert found.returncode == 1, found.stderr
    assert "aten::linalg_eig.default" in found.stdout and "portable_uncovered.py:10" in found.stdout
    clean = script("portable_models.py", tmp_path)
    listed = twice(
        "audit", "--portable", "--json", "--", sys.executable, clean, "mlp", cwd=tmp_path
    )
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["uncovered"] == []


def test_deterministic_portable_switch_in_process():
    import twice

    x = torch.randn(6, 5)
    with twice.deterministic(seed=0, mode="warn", portable=True) as report:
        from twice.portable.dispatch.mode import active

        assert active() is not None and report.to_json()["portable"] is True
        inside = torch.nn.functional.softmax(x, 1)
    from twice.portable.dispatch.mode import active

    assert active() is None
    assert torch.allclose(inside, torch.softmax(x, 1), atol=1e-6)
