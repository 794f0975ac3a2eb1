"""Series read from long traces for plots, streamed: each run's loss per step, and the steps at
which one run's compared fields differ from another's. A million-step trace is read in blocks by
twice._native where it was built (a line that it cannot read, and every line without it, is
parsed and validated as `read_trace` would), never held whole."""

from __future__ import annotations

from pathlib import Path

from twice.core.records import COMPARED_FIELDS
from twice.store.tracescan import TraceLines, take_equal

__all__ = [
    "loss_series",
    "difference_steps",
    "loss_fault",
    "loss_fault_phrase",
    "last_loss",
    "record_series",
    "trace_series",
]


def _first_loss(record) -> float | None:
    loss = record.loss[0] if isinstance(record.loss, list) and record.loss else record.loss
    if not isinstance(loss, str):
        return None
    return float("nan") if loss.startswith("nan") else float.fromhex(loss)


def last_loss(path: Path) -> tuple[int, float] | None:
    """(step, loss) of the trace's last record that has a loss, read from the file's end (the
    last 64 KiB), or None. A damaged last line is skipped, as a kill mid-write leaves one."""
    from twice.core.errors import CorruptRecord
    from twice.core.records import StepRecord
    from twice.store import reader

    size = 1 << 16
    while True:  # back from the end until a whole line is in view (a line is at most 64 MiB)
        try:
            tail = reader.read_tail(path, size)
        except FileNotFoundError:
            return None
        whole = tail[: tail.rfind(b"\n") + 1]  # a last line cut short by a kill is dropped
        lines = whole.split(b"\n")[:-1]
        if len(tail) < size or len(lines) > 1:
            break
        if size >= reader.LINE_LIMIT:
            raise CorruptRecord(
                f"trace {path}: its last line is longer than {reader.LINE_LIMIT >> 20} MiB",
                "the trace is damaged or was edited; re-record the run",
            )
        size *= 16
    lines = lines[1:] if len(tail) == size else lines  # the first may be cut by the window
    for number, line in enumerate(reversed(lines)):
        try:
            record = StepRecord.from_json(reader.parse(line))
        except ValueError as exc:  # the last whole line is checked; earlier ones are diff's
            if number == 0:
                raise CorruptRecord(
                    f"trace {path}: its last record is damaged: {exc}",
                    "the trace is damaged or was edited; re-record the run",
                ) from None
            continue
        loss = record.loss[-1] if isinstance(record.loss, list) and record.loss else record.loss
        if isinstance(loss, str):
            return record.step, float("nan") if loss.startswith("nan") else float.fromhex(loss)
    return None


_SERIES = ("loss", "lr", "grad_norm")


def trace_series(path: Path) -> dict[str, tuple]:
    """{"loss", "lr", "grad_norm": (steps, values)} of a trace in one pass, as int64 and float64
    arrays (NaN for a NaN value; a step without the field left out): the first loss where
    backward ran several times, the first parameter group's learning rate. Every line is
    validated: by twice._native's `series` where it is built, else (and for any line it cannot
    read) parsed as `read_trace` parses it."""
    import numpy as np

    from twice.core import digests

    native = getattr(digests.native, "series", None)
    lines = TraceLines(Path(path))
    found: dict[str, tuple[list, list]] = {name: ([], []) for name in _SERIES}
    try:
        while lines.line() is not None:
            if native is not None:
                steps, values, present, count, pos, last = native(
                    memoryview(lines.buffer)[: lines.end], lines.pos, lines.last_step
                )
                if count:
                    lines.number += count
                    lines.pos, lines.last_step = pos, last
                    steps = np.frombuffer(steps, dtype=np.int64)
                    values = np.frombuffer(values, dtype=np.float64).reshape(len(_SERIES), -1)
                    present = np.frombuffer(present, dtype=np.bool_).reshape(len(_SERIES), -1)
                    for index, name in enumerate(_SERIES):
                        held = present[index, :count]
                        found[name][0].append(steps[held])
                        found[name][1].append(values[index, :count][held])
                    continue
            record = lines.record()
            for name, text in (
                ("loss", _first_loss(record)),
                ("lr", (record.lr or [None])[0]),
                ("grad_norm", record.grad_norm),
            ):
                if isinstance(text, str):
                    text = float("nan") if text.startswith("nan") else float.fromhex(text)
                if text is not None:
                    found[name][0].append(np.array([record.step], dtype=np.int64))
                    found[name][1].append(np.array([text], dtype=np.float64))
    finally:
        lines.close()
    return {
        name: (
            np.concatenate(steps) if steps else np.zeros(0, dtype=np.int64),
            np.concatenate(values) if values else np.zeros(0, dtype=np.float64),
        )
        for name, (steps, values) in found.items()
    }


def record_series(path: Path, every: int = 1) -> dict[str, tuple]:
    """{"lr": (steps, values), "grad_norm": (steps, values)} of a trace, every `every`-th value:
    the learning rate of the first parameter group and the gradient norm, where recorded."""
    series = trace_series(path)
    return {name: (series[name][0][::every], series[name][1][::every]) for name in _SERIES[1:]}


def loss_series(path: Path):
    """(steps, losses) of a trace as int64 and float64 arrays (NaN for a NaN loss; steps without
    a loss left out)."""
    return trace_series(path)["loss"]


def difference_steps(path_a: Path, path_b: Path):
    """(first common step, last common step, steps, masks): the common steps whose compared fields
    differ, each with a bit per COMPARED_FIELDS entry (bit i: field i differs). Equal stretches
    are skipped as bytes; only lines that differ are parsed."""
    import numpy as np

    a, b = TraceLines(Path(path_a)), TraceLines(Path(path_b))
    first = last = None
    steps, masks = [], []
    try:
        while True:
            head = a.step() if first is None and a.line() is not None else None
            if take_equal(a, b):
                first = head if first is None else first
                last = a.last_step
                continue
            step_a, step_b = a.step(), b.step()
            if step_a is None or step_b is None:
                break
            if step_a < step_b:
                a.record()
            elif step_b < step_a:
                b.record()
            else:
                record_a, record_b = a.record(), b.record()
                first = step_a if first is None else first
                last = step_a
                mask = sum(
                    1 << i
                    for i, name in enumerate(COMPARED_FIELDS)
                    if getattr(record_a, name) != getattr(record_b, name)
                )
                if mask:
                    steps.append(step_a)
                    masks.append(mask)
    finally:
        a.close()
        b.close()
    return first, last, np.asarray(steps, dtype=np.int64), np.asarray(masks, dtype=np.int64)


def loss_fault(run_dir: Path) -> dict | None:
    """Where the run's loss stopped being finite, from its traces (one C pass each): {"step",
    "value" ("inf", "-inf" or "nan"), "nan_from" (a step or None)}, or None when every recorded
    loss is finite."""
    import math

    import numpy as np

    from twice.store.layout import RunFolder

    found = None
    for path in RunFolder(run_dir).traces().values():
        steps, values = loss_series(path)
        bad = np.flatnonzero(~np.isfinite(values))
        if not len(bad):
            continue
        step, value = int(steps[bad[0]]), float(values[bad[0]])
        nans = np.flatnonzero(np.isnan(values))
        fault = {
            "step": step,
            "value": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"),
            "nan_from": int(steps[nans[0]]) if len(nans) else None,
        }
        if found is None or fault["step"] < found["step"]:
            found = fault
    return found


def loss_fault_phrase(fault: dict) -> str:
    """ "loss non-finite from step 44 (inf), NaN from step 46"."""
    phrase = f"loss non-finite from step {fault['step']} ({fault['value']})"
    if fault.get("nan_from") is not None and fault["nan_from"] != fault["step"]:
        phrase += f", NaN from step {fault['nan_from']}"
    return phrase


def whole_tensor_steps(path: Path) -> dict[int, str]:
    """{step: params_full} of the records that hold the parameters' whole-tensor digest
    (`twice run --full-every`); the other lines are skipped unparsed."""
    lines = TraceLines(Path(path))
    found: dict[int, str] = {}
    try:
        while (line := lines.line()) is not None:
            if b'"params_full":' in line:
                record = lines.record()
                found[record.step] = record.params_full
            else:
                lines.skip()
    finally:
        lines.close()
    return found


def compare_whole_tensors(path_a: Path, path_b: Path) -> dict | None:
    """How two traces' whole-tensor digests compare over the steps both recorded: {"steps": how
    many, "first_differs": the first step where they differ, or None}; None when they share none.
    Placement-independent: what can be compared across meshes and world sizes."""
    a, b = whole_tensor_steps(path_a), whole_tensor_steps(path_b)
    common = sorted(set(a) & set(b))
    if not common:
        return None
    first = next((step for step in common if a[step] != b[step]), None)
    return {"steps": len(common), "first_differs": first}


def whole_tensors_phrase(found: dict) -> str:
    """In words: "whole tensors (--full-every): identical at all 3 steps both recorded"."""
    if found["first_differs"] is None:
        return (
            f"whole tensors (--full-every): identical at all {found['steps']} steps both recorded"
        )
    return (
        f"whole tensors (--full-every): first differ at step {found['first_differs']} "
        f"({found['steps']} steps both recorded)"
    )
