"""Reading op logs: the op records of chosen steps, validated as they are read.

`ops/ops[.<stream>].jsonl` holds each recorded step as a header line `{"step": N, "ops": K}`
followed by its K op records; a block cut short by a kill reads as not recorded. The older
one-file-per-step form (`ops/step-<n>.jsonl`) still reads.
"""

from __future__ import annotations

from pathlib import Path

from twice.core.errors import CorruptRecord
from twice.store import reader
from twice.store.layout import RunFolder

__all__ = ["step_ops", "steps_ops", "recorded_steps", "read_oplog", "read_dumped_output"]

_HINT = "the op log is damaged: re-record the step with `twice run --record-ops STEP`"


def _parse(line: str, path: Path, number: int) -> dict:
    value = reader.loads(line, f"{path} line {number}", _HINT)
    if not isinstance(value, dict):
        raise CorruptRecord(f"{path} line {number} is not an object", _HINT)
    return value


def _op(line: str, path: Path, number: int) -> dict:
    """One op record, its compared fields checked: a name, digests in and out, numbers as text."""
    op = _parse(line, path, number)
    digests_ok = all(
        isinstance(op.get(key), list)
        and all(item is None or isinstance(item, str) for item in op[key])
        for key in ("in", "out")
    )
    numbers_ok = "sc" not in op or (
        isinstance(op["sc"], list) and all(isinstance(item, str) for item in op["sc"])
    )
    if not (isinstance(op.get("op"), str) and digests_ok and numbers_ok):
        raise CorruptRecord(f"{path} line {number} is not an op record", _HINT)
    return op


def _header(line: str, path: Path, number: int) -> tuple[int, int]:
    header = _parse(line, path, number)
    step, count = header.get("step"), header.get("ops")
    for name, value in (("step", step), ("ops", count)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CorruptRecord(
                f"{path} line {number}: {name} must be a count, not {value!r}", _HINT
            )
    return step, count


def _read(path: Path) -> str:
    try:  # ops/ lies in the run folder: a linked ops/ leading out of it is refused
        return reader.read_record(path, within=Path(path).parent.parent).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"cannot read {path}: {exc}", _HINT) from exc


def step_ops(run_dir: Path, step: int, stream: str | None = None) -> list[dict] | None:
    """The op records of `step` in a run's op log, or None when that step was not recorded."""
    return steps_ops(run_dir, [step], stream)[step]


def steps_ops(run_dir: Path, steps, stream: str | None = None) -> dict[int, list[dict] | None]:
    """The op records of each of `steps` (None for a step not recorded), from one read of the
    log."""
    wanted = set(steps)
    found: dict[int, list[dict] | None] = dict.fromkeys(wanted)
    folder = RunFolder(run_dir)
    path = folder.op_log(stream)
    if not reader.present(path):
        if stream is None:  # op logs written before the per-process file
            for step in wanted:
                legacy = folder.legacy_op_log(step)
                if reader.present(legacy):
                    found[step] = read_oplog(legacy)
        return found
    lines = _read(path).split("\n")
    position = 0
    while position < len(lines):
        line = lines[position]
        position += 1
        if not line.startswith('{"step":'):
            continue
        step, count = _header(line, path, position)
        block = lines[position : position + count]
        start, position = position, position + count
        if step in wanted:
            # Complete only if every line arrived, the last one with its newline.
            complete = len(block) == count and position < len(lines)
            found[step] = (
                [_op(record, path, start + i + 1) for i, record in enumerate(block)]
                if complete
                else None
            )
    return found


def recorded_steps(run_dir: Path, stream: str | None = None) -> list[int]:
    """The steps a run's op log holds."""
    path = RunFolder(run_dir).op_log(stream)
    if not reader.present(path):
        return []
    return sorted(
        {
            _header(line, path, number)[0]
            for number, line in enumerate(_read(path).splitlines(), start=1)
            if line.startswith('{"step":')
        }
    )


def read_oplog(path: Path) -> list[dict]:
    """The op records of an old-style one-file-per-step op log."""
    return [
        _op(line, Path(path), number)
        for number, line in enumerate(_read(Path(path)).splitlines(), start=1)
        if line
    ]


def read_dumped_output(path: Path, key: str):
    """The tensor `key` ("<op>.<output>") of a file of dumped op outputs, or None where the file
    or the key is absent. Read through the door, decoded by safetensors (no code in the format)."""
    if not reader.present(path):
        return None
    try:
        tensors = reader.read_tensors(path, within=Path(path).parent.parent)
    except CorruptRecord:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' own errors have no common base
        raise CorruptRecord(f"cannot read {path}: {exc}", _HINT) from None
    return tensors.get(key)
