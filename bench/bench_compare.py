"""Comparing long runs (issue 28): `twice diff` of two 10^6-step runs, identical and differing at
the last step, `diff --steps 10`, and `twice report` of the two, each in a fresh process, with its
wall time and peak memory (targets: diff at most 3 s and 200 MB, report at most 10 s).

The traces are synthetic but real: lines of twice's own format (~350 bytes), written by twice's
own line writer. BENCH_STEPS changes the length (default 1,000,000); each diff is timed
BENCH_REPEATS times (default 3) and its median printed with the range.
"""

import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import run_folder, size

from twice.core.records import StepRecord, record_line
from twice.store.files import write_json_atomic

STEPS = size("STEPS", 1_000_000, 300)
REPEATS = size("REPEATS", 3, 1)  # each diff timed this often: the median


def _hex(i: int, salt: int) -> str:
    return f"{(i * 0x9E3779B97F4A7C15 + salt) & (2**128 - 1):032x}"


def make_run(folder: Path, name: str, differ_at: int | None) -> Path:
    run_dir = folder / f"20261204-000000-000-{abs(hash(name)) % 16**6:06x}-{name}"
    run_dir.mkdir()
    manifest = {
        "identity": {"argv": ["train.py"], "seed": 0, "determinism": {"mode": "strict"}},
        "context": {"status": "completed", "started": 0.0, "steps": STEPS, "streams": ["main"]},
    }
    write_json_atomic(run_dir / "manifest.json", manifest)
    with open(run_dir / "trace.jsonl", "wb", buffering=1 << 20) as out:
        for step in range(STEPS):
            salt = 1 if step == differ_at else 0
            loss = (2.5 / (1 + step / 1000) + salt).hex()
            record = StepRecord(
                step=step,
                loss=loss,
                batch=_hex(step, 11),
                grads=_hex(step, 12 + salt),
                grad_norm=(1.0 + step % 97 / 100).hex(),
                lr=[(1e-3).hex()],
                params=_hex(step, 13 + salt),
                rng={"numpy": _hex(step, 1), "python": _hex(step, 2), "torch": _hex(step, 3)},
                time=step * 0.0125 + (0.5 if name.endswith("b") else 0.0),
            )
            out.write(record_line(record))
    return run_dir


def measure(*args: str) -> tuple[float, float, str]:
    """(wall seconds, peak MB, first stdout line) of `twice ARGS` in a fresh process."""
    code = (
        "import resource, subprocess, sys, time\n"
        "start = time.perf_counter()\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "wall = time.perf_counter() - start\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "text = done.stdout or done.stderr\n"
        "line = text.splitlines()[0][:90] if text else ''\n"
        "print(f'{wall}|{peak}|{done.returncode}|{line}')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, sys.executable, "-m", "twice", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    wall, peak, returncode, line = out.split("|", 3)
    return float(wall), float(peak), f"exit {returncode}: {line}"


def main() -> None:
    with run_folder() as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        a = make_run(folder, "a", None)
        same = make_run(folder, "same-b", None)
        late = make_run(folder, "late-b", STEPS - 1)
        size = (a / "trace.jsonl").stat().st_size
        print(
            f"{STEPS} steps, {size / STEPS:.0f} bytes a line, {size / 1e6:.0f} MB a trace "
            f"(written in {time.perf_counter() - start:.1f} s)"
        )
        cases = [
            ("diff, identical", ["diff", a, same], 3.0, 200),
            ("diff, differing at the last step", ["diff", a, late], 3.0, 200),
            ("diff --steps 10", ["diff", a, late, "--steps", "10"], 3.0, 200),
            ("report of the two", ["report", a, late, "-o", folder / "r.html"], 10.0, None),
        ]
        for label, args, wall_target, memory_target in cases:
            repeats = 1 if label.startswith("report") else REPEATS
            found = [measure(*map(str, args)) for _ in range(repeats)]
            walls = sorted(f[0] for f in found)
            wall, peak, said = statistics.median(walls), max(f[1] for f in found), found[0][2]
            spread = f" ({walls[0]:.2f}-{walls[-1]:.2f})" if repeats > 1 else ""
            ok = wall <= wall_target and (memory_target is None or peak <= memory_target)
            print(
                f"{label:34s} {wall:6.2f} s{spread} (target {wall_target:g} s)  peak {peak:6.0f} MB"
                + (f" (target {memory_target} MB)" if memory_target else "")
                + f"  {'met' if ok else 'NOT MET'}  [{said}]"
            )


if __name__ == "__main__":
    sys.exit(main())
