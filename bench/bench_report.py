"""Time to build a report of 20 runs of 10,000 steps each (issue 8 target: under 10 s).

The runs are synthetic but complete: a manifest and a 10,000-record trace each, written with
twice's own writers; the second half of the runs diverge at different steps.
"""

import copy
import random
import tempfile
import time
from pathlib import Path

from _common import size

from twice.app.report import write_report
from twice.core.records import StepRecord
from twice.store.files import write_json_atomic
from twice.store.traces import TraceWriter

RUNS, STEPS = size("RUNS", 20, 2), size("STEPS", 10_000, 3_000)


def _digest(kind: int, step: int, differs: bool = False) -> str:
    """A made-up 128-bit digest (32 hex digits) of one field at `step`; another where it differs."""
    return f"{kind:x}{step:030x}{int(differs):x}"


def make_runs(folder: Path) -> list[Path]:
    manifest = {
        "identity": {
            "argv": ["train.py"],
            "seed": 0,
            "packages": {f"pkg{i}": "1.0" for i in range(200)},
            "threads": {"intra_op_threads": 2},
            "determinism": {"mode": "strict"},
        },
        "context": {"status": "completed", "started": 0.0},
    }
    dirs = []
    for run in range(RUNS):
        run_dir = folder / f"20261202-000000-000-{run:06x}-run{run}"
        run_dir.mkdir()
        data = copy.deepcopy(manifest)
        if run >= RUNS // 2:
            data["identity"]["threads"]["intra_op_threads"] = 1
        write_json_atomic(run_dir / "manifest.json", data)
        writer = TraceWriter(run_dir / "trace.jsonl")
        diverge = 2_000 + 500 * run if run >= RUNS // 2 else STEPS
        rng = random.Random(run)
        for step in range(STEPS):
            differs = step >= diverge
            loss = 2.0 / (1 + step / 500) + (rng.random() * 1e-3 if differs else 0.0)
            writer.write(
                StepRecord(
                    step=step,
                    loss=float.hex(loss),
                    batch=_digest(0xB, step),
                    grads=_digest(0xC, step, differs),
                    grad_norm=float.hex(1.0),
                    lr=[float.hex(0.1)],
                    params=_digest(0xD, step, differs),
                    rng={"torch": _digest(0xE, step)},
                    time=step * 0.01,
                )
            )
        writer.close()
        dirs.append(run_dir)
    return dirs


def main():
    with tempfile.TemporaryDirectory() as tmp:
        dirs = make_runs(Path(tmp))
        start = time.perf_counter()
        out = write_report(dirs, Path(tmp) / "report.html")
        elapsed = time.perf_counter() - start
        size = out.stat().st_size / 1e6
    print(
        f"report of {RUNS} runs x {STEPS:,} steps: {elapsed:.1f} s, {size:.1f} MB (target < 10 s)"
    )


if __name__ == "__main__":
    main()
