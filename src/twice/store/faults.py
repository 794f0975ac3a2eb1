"""The faults a run recorded: the NaN/Inf report, the numerical events before it, a capture error.

Read without torch: `twice diff`, `show` and `nan` judge these files on any machine.
"""

from __future__ import annotations

from pathlib import Path

from twice.core.errors import CorruptRecord
from twice.store import reader
from twice.store.layout import RunFolder

__all__ = ["read_numerics", "first_fault", "read_capture_error"]


def _load(path: Path) -> str:
    try:
        return reader.read_record(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptRecord(
            f"cannot read {path}: {exc}", "the run folder is damaged; re-record the run"
        ) from exc


def _json(text: str, where: str, kind: type):
    value = reader.loads(text, where)
    if not isinstance(value, kind):
        raise CorruptRecord(
            f"{where} holds a {type(value).__name__}, not a JSON {kind.__name__}",
            "the run folder is damaged; re-record the run",
        )
    return value


# The fields of a report's fault and of each link of its chain: name -> (type, required).
_FAULT = {"value": (str, True), "step": (int, True), "op": (str, True), "phase": (str, True)}
_LINK = {"step": (int, True), "summary": (str, True), "fix": (str, False)}
_WHERE = {"module": (str, False), "line": (str, False)}


def _event(value, fields: dict) -> bool:
    """Whether `value` is an object with `fields` (and module/line) of their types, null allowed
    where a field is optional."""
    if not isinstance(value, dict):
        return False
    for name, (kind, required) in {**fields, **_WHERE}.items():
        item = value.get(name)
        if item is None and not required:
            continue
        if not isinstance(item, kind) or isinstance(item, bool):
            return False
    return True


def read_numerics(run_dir: Path) -> tuple[dict | None, list[dict]]:
    """(the NaN/Inf report or None, every numerical event) of a run."""
    folder = RunFolder(run_dir)
    report = None
    if reader.present(folder.numerics_report):
        report = _json(_load(folder.numerics_report), str(folder.numerics_report), dict)
        chain = report.get("chain", [])
        if not _event(report.get("fault"), _FAULT) or not (
            isinstance(chain, list) and all(_event(link, _LINK) for link in chain)
        ):
            raise CorruptRecord(
                f"{folder.numerics_report} is not a NaN/Inf report: a 'fault' (value, step, op, "
                "phase) and a 'chain' of events (step, summary) were expected",
                "the run folder is damaged; re-record the run",
            )
    events = []
    if reader.present(folder.numerics_events):
        for number, line in enumerate(_load(folder.numerics_events).splitlines(), start=1):
            if not line:
                continue
            event = _json(line, f"{folder.numerics_events} line {number}", dict)
            if (
                not isinstance(event.get("kind"), str)
                or not isinstance(event.get("step"), int)
                or not isinstance(event.get("summary"), str)
            ):
                raise CorruptRecord(
                    f"{folder.numerics_events} line {number} is not an event (kind, step, summary)",
                    "the run folder is damaged; re-record the run",
                )
            events.append(event)
    return report, events


def first_fault(run_dir: Path) -> dict | None:
    """The run's first non-finite value, as {"step", "summary"}, or None."""
    report, events = read_numerics(run_dir)
    if report is not None:
        fault = report["fault"]
        return {
            "step": fault["step"],
            "summary": f"{fault.get('value')} from {fault.get('op')} at {fault.get('line') or '?'}",
        }
    bad = next((e for e in events if e["kind"] == "non_finite"), None)
    return None if bad is None else {"step": bad["step"], "summary": bad["summary"]}


def read_capture_error(run_dir: Path) -> dict | None:
    """capture_error.json, validated (the step, the handler and the error of twice's own that
    stopped the step capture), or None where the capture was never stopped."""
    path = RunFolder(run_dir).capture_error
    try:
        value = reader.read_json(path)
    except FileNotFoundError:
        return None
    step = value.get("step") if isinstance(value, dict) else None
    if not (
        isinstance(value, dict)
        and type(step) is int
        and step >= 0
        and isinstance(value.get("error"), str)
        and isinstance(value.get("handler", ""), str)
    ):
        raise CorruptRecord(
            f"{path} is not a capture error (a step, a handler and an error were expected)",
            "the run folder is damaged or was edited; remove the file or re-record the run",
        )
    return value
