"""`twice ls`: the runs and sweeps of a runs folder as a table (drawn by app/terminal.py), and
the sweep summaries it lists beside the runs."""

from __future__ import annotations

import math
import time
from pathlib import Path

from twice.core.errors import CorruptRecord, UsageError
from twice.store.reader import present
from twice.store.sweeps import SWEEP_FILE, read_sweep
from twice.store.traceseries import loss_fault_phrase

__all__ = ["format_run_table", "summarize_sweeps"]


def summarize_sweeps(runs_dir: Path) -> list[dict]:
    """One summary per sweep folder directly under `runs_dir`: its grid, seeds, and how many of its
    trials completed or failed. A sweep folder whose spec is damaged is listed as such."""
    from twice.store.runs import effective_status, list_runs, read_manifest

    out = []
    for folder in sorted(p for p in Path(runs_dir).iterdir() if present(p / SWEEP_FILE)):
        row: dict = {"sweep": folder.name, "path": str(folder)}
        try:
            spec = read_sweep(folder)
        except (CorruptRecord, UsageError) as exc:
            row["error"] = str(exc.message)
            out.append(row)
            continue
        statuses: dict[str, int] = {}
        for trial in list_runs(folder / "trials"):
            try:
                status = effective_status(read_manifest(trial))
            except CorruptRecord:
                status = "damaged"
            statuses[status] = statuses.get(status, 0) + 1
        row.update(
            grid={k: list(v) for k, v in spec.grid.items()},
            seeds=spec.seeds,
            trials=math.prod(len(v) for v in spec.grid.values()) * spec.seeds,
            statuses=statuses,
        )
        out.append(row)
    return out


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


def _status(row: dict) -> str:
    status = row["status"]
    if row.get("exit_code") not in (None, 0):
        status += f" ({row['exit_code']})"
    if row.get("loss_fault"):
        status += " (non-finite loss)"
    if row.get("capture_error"):
        status += " (capture stopped)"
    if row.get("error"):
        status += f": {row['error']}"
    return status


def format_run_table(rows: list[dict], sweeps: list[dict], width: int | None = None) -> str:
    """The table `twice ls` prints: a header, one row per run (its name first; runs made by
    twice's own commands marked), then the sweeps."""
    from twice.app.terminal import table_text

    columns = {
        column: {"justify": justify, "overflow": "fold"}
        if column != "command"
        else {"rest": True}  # one line, as wide as the other columns leave
        for column, justify in (
            ("run", "left"),
            ("id", "left"),
            ("status", "left"),
            ("started", "left"),
            ("took", "right"),
            ("steps", "right"),
            ("final loss", "right"),
            ("command", "left"),
        )
    }
    cells, notes = [], []
    names = {"-".join(r["id"].split("-", 4)[:4]): r.get("name") for r in rows}
    for row in rows:
        name = row.get("name") or "-"
        if row.get("rerun_of"):  # "verify of 20261204-162038-444-120047" -> "verify of base"
            what, _, of = row["rerun_of"].rpartition(" of ")
            name = f"[{what} of {names.get(of[:26]) or of}]"
        started = (
            time.strftime("%Y-%m-%d %H:%M", time.localtime(row["started"]))
            if row.get("started")
            else "?"
        )
        loss = row.get("final_loss")
        cells.append(
            [
                name,
                "-".join(row["id"].split("-", 4)[:4]),
                _status(row),
                started,
                _duration(row.get("duration")),
                "-" if row.get("steps") is None else str(row["steps"]),
                "-" if loss is None else f"{loss:.6g}",
                row["command"],
            ]
        )
    for row in rows:  # the faults in words, under the table
        if row.get("loss_fault"):
            notes.append(
                f"{row.get('name') or row['id']}: {loss_fault_phrase(row['loss_fault'])}: "
                f"see `twice nan {row['id']}`"
            )
    for sweep in sweeps:
        if "error" in sweep:
            notes.append(f"sweep {sweep['sweep']}: damaged ({sweep['error']})")
            continue
        grid = " x ".join(f"{k}={','.join(v)}" for k, v in sweep["grid"].items())
        counts = ", ".join(f"{n} {status}" for status, n in sorted(sweep["statuses"].items()))
        notes.append(
            f"sweep {sweep['sweep']}: {grid}, {sweep['seeds']} seeds: {sweep['trials']} trials "
            f"({counts or 'none run yet'})"
        )
    return table_text(columns, cells, notes, width)
