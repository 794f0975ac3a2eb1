"""The GPU proof (issue 11), one script for the GPU machine: `python bench/gpu_check.py [--out
DIR]`.

1. A small CNN with conv backward and an index_add_/scatter_add_ layer, trained twice on CUDA:
   `twice audit --determinism off` names the nondeterministic operations it really hit, and two
   strict `twice run`s are bit-identical.
2. CUBLAS_WORKSPACE_CONFIG set after CUDA initialisation is refused in strict mode.
3. On-device digests: equal to the device algorithm run on the CPU for every dtype; throughput on
   a 4 GB tensor against the device's copy bandwidth measured here (target: at least 40%).
4. The price of determinism: step time of a ResNet-style and a Transformer-style model,
   deterministic against default, and the overhead of twice's step tracing (target: at most 3%).
5. The same run on CPU and GPU: per-layer differences, each called expected (reduction order, TF32
   scale) or suspicious.
6. Portable mode on CPU and GPU (issue 42): tests/e2e/scripts/portable_models.py (an MLP, a CNN with
   batch norm, a transformer, an LSTM language model, a bf16-autocast MLP and the other families)
   under `twice run --portable` on the CPU and on the device: byte-identical parameters for every
   (model, optimizer), or each differing tensor named with its largest difference.
7. The portable step on the device against the plain step there (target: at most 3x), and the
   trace's overhead at batch 64 and at a realistic size (batch 256) (target: at most 5%).
8. The trace read a step late (one multi-tensor Triton fold, pinned asynchronous copies) against
   the synchronous trace of the same training, record by record, and its fold against the CPU's.
9. The test suite's examples-style scripts (tests/e2e/scripts/tiny_train.py, everything.py, with and
   without DataLoader workers) under `twice run` on the device, twice each: bit-identical.

`--device cpu --smoke` runs the same code paths on the CPU with tiny sizes (CUDA-only checks are
skipped); tests/e2e/test_gpu_check.py does that here.
Prints a summary and writes gpu_check.json into --out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

TRAIN = r"""
import sys, torch
from torch import nn
device = sys.argv[1]
torch.manual_seed(0)
class Scatter(nn.Module):
    def forward(self, x):
        index = (torch.arange(x.shape[1], device=x.device) % 7)
        out = torch.zeros(x.shape[0], 7, device=x.device).index_add_(1, index, x)
        return out.scatter_add(1, index[:7].expand(x.shape[0], 7), out)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                      nn.ReLU(), nn.Flatten(), Scatter(), nn.Linear(7, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(8, 64, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
target = torch.randint(0, 10, (8, 64), generator=torch.Generator().manual_seed(2)).to(device)
for step in range(8):
    opt.zero_grad()
    nn.functional.cross_entropy(model(data[step]), target[step]).backward()
    opt.step()
"""


def twice(*args, cwd, env=None):
    return subprocess.run(
        [sys.executable, "-m", "twice", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env or os.environ.copy(),
        timeout=600,
    )


def check_determinism(device, tmp):
    (tmp / "cnn.py").write_text(TRAIN)
    audit = twice(
        "audit",
        "--steps",
        "2",
        "--determinism",
        "off",
        "--json",
        "--",
        sys.executable,
        "cnn.py",
        device,
        cwd=tmp,
    )
    found = (
        json.loads(audit.stdout)
        if audit.stdout.startswith("{")
        else {"error": audit.stderr[-2000:]}
    )
    for name in ("a", "b"):
        twice("run", "--name", name, "--", sys.executable, "cnn.py", device, cwd=tmp)
    runs = sorted((tmp / "runs").glob("*-[ab]"))
    diff = twice("diff", *runs[-2:], "--json", cwd=tmp)
    return {
        "audit": found,
        "strict_runs_identical": json.loads(diff.stdout)["identical"] if diff.stdout else None,
        "diff_verdict": json.loads(diff.stdout)["verdict"] if diff.stdout else diff.stderr[-500:],
    }


def check_late_cublas(device):
    if device != "cuda":
        return {"skipped": "needs CUDA"}
    code = (
        "import torch, twice\na = torch.ones(8, 8, device='cuda'); (a @ a).sum().item()\n"
        "try:\n    twice.deterministic(seed=0)\n    print('accepted')\nexcept "
        "twice.DeterminismError as e:\n    print(e.render())"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    env["PYTHONHASHSEED"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    ).stdout
    return {
        "refused": out.startswith("error: CUDA was initialised before CUBLAS_WORKSPACE_CONFIG"),
        "output": out.strip(),
    }


def check_digests(device):
    from twice.core.device_fold import device_fold

    dtypes = [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.complex64,
    ]
    correct = {}
    for dtype in dtypes:
        cpu = (
            (torch.randn(1001, 37) * 50).to(dtype)
            if dtype.is_floating_point or dtype.is_complex
            else torch.randint(0, 2 if dtype is torch.bool else 100, (1001, 37)).to(dtype)
        )
        on_device = cpu.to(device)
        correct[str(dtype)] = device_fold(on_device) == device_fold(cpu) and device_fold(
            on_device.t()
        ) == device_fold(cpu.t())
    from twice.core.device_fold import _triton_fold, device_fold_many

    tensors = [
        torch.randn(n, generator=torch.Generator().manual_seed(n)).to(device)
        for n in (1, 7, 4096, 5000, 100_003)
    ]
    correct["many_at_once"] = device_fold_many(tensors) == [device_fold(t) for t in tensors]
    result = {
        "correct_for_every_dtype": all(correct.values()),
        "per_dtype": correct,
        "triton_kernel": device == "cuda" and _triton_fold() is not None,
    }
    if device == "cuda":
        big = torch.randint(
            -(2**31), 2**31 - 1, (2**30,), dtype=torch.int32, device="cuda"
        )  # 4 GiB
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            big.clone()
        torch.cuda.synchronize()
        copy_bandwidth = 3 * 2 * big.numel() * 4 / (time.perf_counter() - start)  # read + write
        device_fold(big[: 1 << 20])  # compiles the kernel (Triton) outside the timing
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            device_fold(big)
        torch.cuda.synchronize()
        digest_rate = 3 * big.numel() * 4 / (time.perf_counter() - start)
        result.update(
            copy_gbps=copy_bandwidth / 1e9,
            digest_gbps=digest_rate / 1e9,
            share_of_copy_bandwidth=digest_rate / copy_bandwidth,
        )
        del big
    return result


def _resnetish():
    def block(c):
        return nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1),
            nn.BatchNorm2d(c),
        )

    return (
        nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1),
            *[block(64) for _ in range(4)],
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
        ),
        (3, 32, 32),
        10,
    )


def _transformerish():
    layer = nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True)
    return (
        nn.Sequential(nn.TransformerEncoder(layer, 4), nn.Flatten(), nn.Linear(256 * 64, 10)),
        (64, 256),
        10,
    )


def _step_time(build, device, deterministic, trace, steps=30, batch=64, portable=False, warmup=5):
    """Seconds per training step (after `warmup` untimed steps), deterministic or not, traced or
    not, in portable mode or not."""
    from twice.portable.dispatch import mode
    from twice.record import hooks

    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cuda.matmul.allow_tf32 = not deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.manual_seed(0)
    model, shape, classes = build()
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, *shape, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    recorder = hooks.install(hooks.Recorder(tempfile.mkdtemp())) if trace else None
    active = mode.enable("warn") if portable else None
    try:
        for step in range(steps + warmup):
            if step == warmup:
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / steps
    finally:
        if active is not None:
            mode.disable()
        if recorder is not None:
            hooks.uninstall()
        torch.use_deterministic_algorithms(False)


def check_price(device, smoke=False):
    out = {}
    sizes = {"steps": 3, "batch": 4} if smoke else {}
    for name, build in (("resnet_style", _resnetish), ("transformer_style", _transformerish)):
        default = _step_time(build, device, False, False, **sizes)
        deterministic = _step_time(build, device, True, False, **sizes)
        traced = _step_time(build, device, True, True, **sizes)
        out[name] = {
            "default_ms": default * 1e3,
            "deterministic_ms": deterministic * 1e3,
            "determinism_cost": deterministic / default - 1,
            "traced_ms": traced * 1e3,
            "tracing_overhead": traced / deterministic - 1,
        }
    return out


def check_cpu_vs_gpu(device):
    if device != "cuda":
        return {"skipped": "needs CUDA"}
    results = {}
    states = {}
    for where in ("cpu", "cuda"):
        torch.manual_seed(0)
        model, shape, classes = _resnetish()
        model = model.to(where)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(16, *shape, generator=torch.Generator().manual_seed(3)).to(where)
        y = torch.randint(0, classes, (16,), generator=torch.Generator().manual_seed(4)).to(where)
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        states[where] = {
            k: v.detach().cpu().double()
            for k, v in model.state_dict().items()
            if v.is_floating_point()
        }
    for key, cpu in states["cpu"].items():
        gpu = states["cuda"][key]
        relative = float((cpu - gpu).abs().max() / cpu.abs().max().clamp_min(1e-30))
        # float32 reduction-order differences stay near 1e-6 relative after a few steps; TF32 is off
        # here.
        results[key] = {
            "max_abs": float((cpu - gpu).abs().max()),
            "max_relative": relative,
            "verdict": "expected (reduction order)" if relative < 1e-4 else "suspicious",
        }
    return results


SCRIPTS = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "scripts"


def check_portable(device, tmp, smoke=False):
    """Portable training of every family on the CPU and on `device`: the parameters' bytes
    compared, each differing tensor named with its largest difference."""
    import shutil

    models = "mlp,cnn,bf16" if smoke else "mlp,cnn,transformer,lstm,dcgan,vae,resnet,bf16"
    found = {}
    for where in ("cpu", device):
        folder = tmp / f"portable-{where}"
        folder.mkdir(exist_ok=True)
        shutil.copy(SCRIPTS / "portable_models.py", folder)
        env = {**os.environ, "PORTABLE_DEVICE": where}
        result = twice(
            "run", "--portable", "--", sys.executable, "portable_models.py", models,
            cwd=folder, env=env,
        )  # fmt: skip
        if result.returncode != 0:
            return {"error": f"the {where} run failed: {result.stderr[-600:]}"}
        found[where] = torch.load(folder / "portable_params.pt")
    cpu, other = found["cpu"], found[device]
    out = {"identical": [], "differ": {}}
    for case, state in cpu.items():
        differing = {
            name: float((tensor.double() - other[case][name].double()).abs().max())
            for name, tensor in state.items()
            if not torch.equal(tensor, other[case][name])
        }
        if differing:
            out["differ"][case] = differing
        else:
            out["identical"].append(case)
    out["bits_equal"] = not out["differ"]
    return out


def check_portable_price(device, smoke=False):
    """The portable step against the plain step on `device`; the trace's overhead at batch 64 and
    at a realistic batch."""
    sizes = {"steps": 2, "batch": 4} if smoke else {"steps": 10, "batch": 64}
    out = {}
    for name, build in (("resnet_style", _resnetish), ("transformer_style", _transformerish)):
        plain = _step_time(build, device, True, False, warmup=2, **sizes) * 1e3
        portable = _step_time(build, device, True, False, portable=True, warmup=2, **sizes) * 1e3
        out[name] = {"plain_ms": plain, "portable_ms": portable, "ratio": portable / plain}
        big = {"steps": 2, "batch": 8} if smoke else {"steps": 20, "batch": 256}
        deterministic = _step_time(build, device, True, False, **big)
        traced = _step_time(build, device, True, True, **big)
        out[name]["traced_overhead_batch_" + str(big["batch"])] = traced / deterministic - 1
    return out


def check_examples(device, tmp, smoke=False):
    """The test suite's examples-style scripts (a DataLoader with and without workers, dropout,
    MixUp, bf16 autocast with a GradScaler, clipping, AdamW with OneCycleLR, twice.Run) under
    `twice run` on `device` (EXAMPLE_DEVICE), twice each: the two runs must be bit-identical."""
    import shutil

    cases = {
        "tiny_train": ["tiny_train.py", "out.pt"],
        "tiny_train_workers": ["tiny_train.py", "out.pt", "--workers", "2"],
        "everything": ["everything.py", "0"],
        "everything_workers": ["everything.py", "2"],
    }
    if smoke:
        cases = {name: cases[name] for name in ("tiny_train", "everything")}
    out = {}
    for name, argv in cases.items():
        folder = tmp / f"example-{name}"
        folder.mkdir(exist_ok=True)
        shutil.copy(SCRIPTS / argv[0], folder)
        env = {**os.environ, "EXAMPLE_DEVICE": device}
        failed = None
        for label in ("a", "b"):
            result = twice("run", "--name", label, "--", sys.executable, *argv, cwd=folder, env=env)
            if result.returncode != 0:
                failed = f"run {label} failed: {result.stderr[-400:]}"
                break
        if failed:
            out[name] = {"identical": False, "verdict": failed}
            continue
        diff = twice("diff", *sorted((folder / "runs").glob("*-[ab]")), "--json", cwd=folder)
        found = json.loads(diff.stdout) if diff.stdout.startswith("{") else {}
        out[name] = {
            "identical": found.get("identical") is True,
            "verdict": found.get("verdict") or diff.stderr[-400:],
        }
    return out


def check_late_trace(device):
    """The trace read a step late (record/latewrite.py) against the synchronous trace of the
    same training, record by record; and the multi-tensor fold against the CPU's fold."""
    if device != "cuda":
        return {"skipped": "needs CUDA"}
    import struct

    from twice._fold_kernel import fold_many
    from twice.core.device_fold import device_fold
    from twice.record import hooks
    from twice.record.latewrite import LateWriter
    from twice.record.recorder import Recorder

    generator = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(n, generator=generator).to(dtype)
        for n, dtype in ((1, torch.float32), (4097, torch.bfloat16), (3, torch.float16),
                         (70001, torch.float32), (9, torch.float64), (0, torch.float32))
    ] + [torch.randint(-9, 9, (13,), generator=generator, dtype=torch.int8)]  # fmt: skip
    raws = [t.cuda().reshape(-1).view(torch.uint8) for t in tensors]
    sums = fold_many(raws, []).cpu().numpy()
    folds_equal = all(
        struct.pack("<q", raw.numel()) + row.astype("<i8").tobytes() == device_fold(t)
        for t, raw, row in zip(tensors, raws, sums)
    )
    traces, taken = {}, None
    for mode in ("late", "now"):
        folder = Path(tempfile.mkdtemp())
        recorder = Recorder(folder)
        if mode == "now":
            recorder.late = LateWriter(devices=())
        hooks.install(recorder)
        try:
            torch.manual_seed(0)
            model, shape, classes = _resnetish()
            model = model.to(device)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            for _ in range(6):
                x = torch.randn(16, *shape, device=device)
                y = torch.randint(0, classes, (16,), device=device)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        finally:
            hooks.uninstall()
            recorder.finish()
        if mode == "late":
            taken = bool(recorder.late._fold)
        lines = (folder / "trace.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        traces[mode] = [{k: v for k, v in r.items() if k != "time"} for r in records]
    return {
        "folds_equal_cpu": folds_equal,
        "late_path_taken": taken,
        "identical": traces["late"] == traces["now"] and len(traces["now"]) == 6,
        "steps": len(traces["late"]),
    }


def judge(report, device):
    """(checks, targets): each a list of (name, passed or None when not measured here, detail).

    A failed check is a wrong result and fails the script; a target is a speed figure to publish."""
    checks, targets = [], []
    det = report.get("determinism", {})
    checks.append(
        (
            "two strict runs are bit-identical",
            det.get("strict_runs_identical") is True,
            str(det.get("diff_verdict"))[:120],
        )
    )
    digests = report.get("digests", {})
    checks.append(
        (
            "on-device digests equal the CPU's for every dtype",
            digests.get("correct_for_every_dtype") is True,
            ", ".join(k for k, ok in digests.get("per_dtype", {}).items() if not ok) or "all",
        )
    )
    if device == "cuda":
        cublas = report.get("late_cublas", {})
        checks.append(
            (
                "late CUBLAS_WORKSPACE_CONFIG refused in strict mode",
                cublas.get("refused") is True,
                cublas.get("output", "")[:120],
            )
        )
        found = det.get("audit", {})
        checks.append(
            (
                "the audit names the nondeterministic CUDA ops it hit",
                any(
                    "index_add" in op or "scatter_add" in op
                    for op in found.get("cuda_nondeterministic") or {}
                ),
                ", ".join(found.get("cuda_nondeterministic") or {}) or str(found)[:160],
            )
        )
        share = digests.get("share_of_copy_bandwidth")
        targets.append(
            (
                "GPU digest at >= 40% of copy bandwidth",
                None if share is None else share >= 0.4,
                f"{digests.get('digest_gbps', 0):.0f} GB/s of {digests.get('copy_gbps', 0):.0f}",
            )
        )
    for name, figures in (report.get("price") or {}).items():
        if isinstance(figures, dict) and "tracing_overhead" in figures:
            targets.append(
                (
                    f"{name}: tracing overhead <= 5% at batch 64",
                    figures["tracing_overhead"] <= 0.05,
                    f"determinism costs {figures['determinism_cost']:+.1%}, "
                    f"tracing {figures['tracing_overhead']:+.1%}",
                )
            )
    portable = report.get("portable", {})
    if "bits_equal" in portable:
        checks.append(
            (
                f"portable bits equal on the CPU and {device}",
                portable["bits_equal"],
                "; ".join(
                    f"{case}: "
                    + ", ".join(f"{t} (max {d:.3g})" for t, d in list(tensors.items())[:3])
                    for case, tensors in portable["differ"].items()
                )
                or f"{len(portable['identical'])} cases identical",
            )
        )
    for name, figures in (report.get("portable_price") or {}).items():
        if isinstance(figures, dict) and "ratio" in figures:
            targets.append(
                (
                    f"{name}: portable step <= 3x the plain step",
                    figures["ratio"] <= 3,
                    f"{figures['portable_ms']:.2f} ms against {figures['plain_ms']:.2f} ms "
                    f"({figures['ratio']:.2f}x)",
                )
            )
            for key, value in figures.items():
                if key.startswith("traced_overhead_batch_"):
                    targets.append(
                        (
                            f"{name}: trace <= 5% at batch {key.rsplit('_', 1)[1]}",
                            value <= 0.05,
                            f"{value:+.1%}",
                        )
                    )
    late = report.get("late_trace", {})
    if "identical" in late:
        checks.append(
            (
                "the trace read a step late equals the synchronous trace",
                late["identical"] and late["late_path_taken"] and late["folds_equal_cpu"],
                f"{late['steps']} steps; late path taken: {late['late_path_taken']}; "
                f"multi-tensor fold equals the CPU's: {late['folds_equal_cpu']}",
            )
        )
    for name, found in (report.get("examples") or {}).items():
        if isinstance(found, dict) and "identical" in found:
            checks.append(
                (
                    f"examples: {name} twice under twice run on {device} is bit-identical",
                    found["identical"],
                    str(found["verdict"])[:160],
                )
            )
    for name in (
        "determinism", "late_cublas", "digests", "price", "cpu_vs_gpu", "portable",
        "portable_price", "late_trace", "examples",
    ):  # fmt: skip
        if "error" in report.get(name, {}):
            checks.append((f"{name} ran", False, report[name]["error"][:200]))
    return checks, targets


def markdown(report, checks, targets):
    """The report as Markdown: the checks, the targets and the step times."""
    mark = {True: "pass", False: "FAIL", None: "not measured"}
    lines = [
        f"# GPU check: {report['device']}, torch {report['torch']} "
        f"(CUDA {report.get('cuda')}), {report['date']}",
        "",
        "| check | result | detail |",
        "| --- | --- | --- |",
    ]
    checks = [(name, ok, " ".join(str(detail).split())) for name, ok, detail in checks]
    lines += [f"| {name} | {mark[ok]} | {detail} |" for name, ok, detail in checks]
    lines += ["", "| target | met | figure |", "| --- | --- | --- |"]
    lines += [f"| {name} | {mark[ok]} | {detail} |" for name, ok, detail in targets]
    lines += [
        "",
        "| model | default ms | deterministic ms | traced ms |",
        "| --- | --- | --- | --- |",
    ]
    for name, f in (report.get("price") or {}).items():
        if isinstance(f, dict) and "default_ms" in f:
            lines.append(
                f"| {name} | {f['default_ms']:.2f} | {f['deterministic_ms']:.2f} | "
                f"{f['traced_ms']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: check the code paths, not the figures"
    )
    args = parser.parse_args()
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = {
        "device": card,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in (
            ("determinism", lambda: check_determinism(args.device, Path(tmp))),
            ("late_cublas", lambda: check_late_cublas(args.device)),
            ("digests", lambda: check_digests(args.device)),
            ("price", lambda: check_price(args.device, args.smoke)),
            ("cpu_vs_gpu", lambda: check_cpu_vs_gpu(args.device)),
            ("portable", lambda: check_portable(args.device, Path(tmp), args.smoke)),
            ("portable_price", lambda: check_portable_price(args.device, args.smoke)),
            ("late_trace", lambda: check_late_trace(args.device)),
            ("examples", lambda: check_examples(args.device, Path(tmp), args.smoke)),
        ):
            start = time.perf_counter()
            try:
                report[name] = check()
            except Exception as exc:  # noqa: BLE001 - one failed check must not hide the others' figures
                report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            report[name + "_seconds"] = round(time.perf_counter() - start, 1)
            print(f"{name}: {json.dumps(report[name], default=str)[:600]}", flush=True)
    checks, targets = judge(report, args.device)
    report["checks"] = [{"check": n, "passed": ok, "detail": d} for n, ok, d in checks]
    report["targets"] = [{"target": n, "met": ok, "figure": d} for n, ok, d in targets]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    text = markdown(report, checks, targets)
    (Path(args.out) / "gpu_check.md").write_text(text)
    print(text)
    failed = [name for name, ok, _ in checks if ok is False]
    if failed:
        print(f"gpu_check: {len(failed)} check(s) failed: {'; '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
