"""`twice locate` and `twice audit`: the operation, module and line where runs first compute
different bits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twice.app.compare import compare_runs
from twice.app.rerun import rerun_options, start_rerun
from twice.app.trust import Consent, Rerun, trusted_rerun
from twice.core.errors import Exit, UsageError
from twice.core.opdiff import OpFinding, first_op_difference, value_gap
from twice.core.protocol import ChildSettings
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder
from twice.store.oplogs import step_ops

__all__ = ["Location", "locate_runs", "bisect_divergence", "describe_op"]


def describe_op(op: dict | None) -> dict:
    """The fields of a recorded op that name it to a reader."""
    if op is None:
        return {}
    return {
        k: op.get(k) for k in ("i", "op", "phase", "module", "line", "node", "shapes", "dtypes")
    }


@dataclass
class Location:
    """What `locate_runs` found; `sentence` is the one-line answer."""

    sentence: str
    step: int | None
    finding: OpFinding | None
    gap: dict[str, Any] = field(default_factory=dict)
    logs: tuple[str, str] | None = None

    @property
    def exit_code(self) -> int:
        """The command's exit code: 0 when nothing differs or failed, 1 otherwise."""
        return Exit.SAME if self.finding is None else Exit.DIFFER

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "sentence": self.sentence,
            "step": self.step,
            "gap": self.gap,
            "logs": list(self.logs or ()),
            "finding": None
            if self.finding is None
            else {
                **self.finding.to_json(),
                "a": describe_op(self.finding.a),
                "b": describe_op(self.finding.b),
            },
        }


def _op_log(rerun: Rerun, step: int, label: str, quiet: bool) -> tuple[list[dict], str]:
    """The run's op records of `step` and where they are, recording them by re-running the run up
    to that step if its op log does not hold it."""
    run_dir = rerun.run_dir
    records = step_ops(run_dir, step)
    if records is not None:
        return records, f"{RunFolder(run_dir).ops} (step {step})"
    options = rerun_options(
        rerun,
        name=f"locate-{label}-{run_dir.name[:26]}",
        steps=step + 1,
        quiet=quiet,
        record_ops=str(step),
    )
    _, new_dir = start_rerun(rerun, options)
    records = step_ops(new_dir, step)
    if records is None:
        raise UsageError(
            f"re-running {run_dir} did not reach step {step}", f"see {RunFolder(new_dir).stderr}"
        )
    return records, f"{RunFolder(new_dir).ops} (step {step})"


def _dumped_output(rerun: Rerun, step: int, index: int, output: int, label: str, quiet: bool):
    """Re-run the run to step `step` saving op `index`'s outputs; return output `output`, or
    None."""
    from twice.store.oplogs import read_dumped_output

    options = rerun_options(
        rerun,
        name=f"locate-dump-{label}-{rerun.run_dir.name[:26]}",
        steps=step + 1,
        quiet=quiet,
        record_ops=str(step),
    )
    options.env = {**options.env, **ChildSettings(dump_op=f"{step}:{index}").to_env()}
    _, new_dir = start_rerun(rerun, options)
    return read_dumped_output(RunFolder(new_dir).dumped_output(step, index), f"{index}.{output}")


def _where(op: dict) -> str:
    parts = [op["op"]]
    if op.get("module"):
        parts.append(f"in {op['module']}")
    parts.append(f"({op['phase']}{', ' + op['node'] if op.get('node') else ''})")
    if op.get("line"):
        parts.append(f"at {op['line']}")
    return " ".join(parts)


@dataclass
class Bisection:
    """The first diverging step found by replays, and how many replays (each re-runs A and B) it
    took."""

    step: int | None
    replays: int
    interval: tuple[int, int] | None = None

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "step": self.step,
            "replays": self.replays,
            "interval": list(self.interval) if self.interval else None,
        }


def _replay_fingerprint(rerun: Rerun, step: int, label: str, quiet: bool):
    """Re-run the run up to `step` (from its latest checkpoint before it, when it has one)
    recording only that step."""
    import twice.checkpoint as checkpoints
    from twice.store.traces import read_trace

    run_dir = rerun.run_dir
    options = rerun_options(rerun, name=f"bisect-{label}-{step}", steps=step + 1, quiet=quiet)
    options.env = {**options.env, **ChildSettings(trace_steps=str(step)).to_env()}
    earlier = [
        p
        for p in checkpoints.list_checkpoints(RunFolder(run_dir).checkpoints)
        if int(p.name.split("-")[1]) <= step
    ]
    if earlier:
        options.resume_from = earlier[-1]
    _, new_dir = start_rerun(rerun, options)
    record = next((r for r in read_trace(RunFolder(new_dir).trace()) if r.step == step), None)
    if record is None:
        raise UsageError(
            f"replaying {run_dir} did not reach step {step}", f"see {RunFolder(new_dir).stderr}"
        )
    return record


def bisect_divergence(a: Path, b: Path, quiet: bool = True, yes: Consent = False) -> Bisection:
    """First diverging step of runs whose traces are coarse (--trace-every K), in ceil(log2(K))
    replays.

    Between the last recorded step where both runs agree and the first where they differ, each
    replay re-runs both up to the middle step, fingerprints only that step, and halves the interval.
    Folders this user's twice did not sign need `yes` (see app/trust.py).
    """
    from twice.core.divergence import first_divergence
    from twice.store.traces import read_trace

    rerun_a, rerun_b = trusted_rerun(a, yes), trusted_rerun(b, yes)
    comparison = compare_runs(a, b)
    if comparison.divergence is None:
        return Bisection(None, 0)
    high = comparison.divergence.step
    agreed = [r.step for r in read_trace(RunFolder(a).trace()) if r.step < high]
    low = max(agreed) if agreed else -1
    interval, replays = (low, high), 0
    while high - low > 1:
        middle = (low + high) // 2
        record_a = _replay_fingerprint(rerun_a, middle, "a", quiet)
        record_b = _replay_fingerprint(rerun_b, middle, "b", quiet)
        replays += 1
        if first_divergence([record_a], [record_b]) is None:
            low = middle
        else:
            high = middle
    return Bisection(high, replays, interval)


def locate_runs(a: Path, b: Path, quiet: bool = True, yes: Consent = False) -> Location:
    """Find the first diverging step of runs A and B, then the first operation in it that differs;
    the finding is kept in A's folder (`twice report` shows it). Folders this user's twice did not
    sign need `yes` (their commands are re-run; see app/trust.py)."""
    result = _locate(trusted_rerun(a, yes), trusted_rerun(b, yes), quiet)
    write_json_atomic(RunFolder(a).location(Path(b).name), result.to_json())
    return result


def _locate(rerun_a: Rerun, rerun_b: Rerun, quiet: bool) -> Location:
    """The first diverging step of both re-runs' folders, and the first operation in it that
    differs, each side re-run up to that step."""
    a, b = rerun_a.run_dir, rerun_b.run_dir
    comparison = compare_runs(a, b)
    divergence = comparison.divergence
    if divergence is None:
        return Location("runs do not diverge: nothing to locate", None, None)
    if divergence.stream != "main":
        raise UsageError(
            f"the runs first differ in stream {divergence.stream}, which locate cannot replay",
            "record ops of that process with `twice run --record-ops STEP` and compare them",
        )
    step = divergence.step
    if divergence.first == "batch":
        # The data differ before any computation of the step: no operation of the model is to blame.
        return Location(
            f"step {step}: the first difference is the input batch (data), not an operation: "
            "the runs fed different batches into the step",
            step,
            OpFinding("input", None),
        )
    (ops_a, log_a), (ops_b, log_b) = (
        _op_log(rerun_a, step, "a", quiet),
        _op_log(rerun_b, step, "b", quiet),
    )
    finding = first_op_difference(ops_a, ops_b)
    logs = (log_a, log_b)
    located = _unmeasured(step, finding, logs)
    if located is not None:
        return located
    return _measured(rerun_a, rerun_b, step, finding, logs, quiet)


def _unmeasured(step: int, finding: OpFinding, logs: tuple) -> Location | None:
    """The location of a first op difference that needs no output measured: none in the re-runs,
    the sequences parting, different numbers given, or a differing input. None for an op whose
    outputs differ."""
    if finding.kind == "identical":
        return Location(
            f"step {step} differs in the trace, but every recorded operation agrees in the "
            f"re-runs: "
            "the difference did not reproduce (or arises outside torch operations)",
            step,
            None,
            logs=logs,
        )
    op = finding.a or finding.b
    if finding.kind == "sequence":
        return Location(
            f"step {step}: the operation sequences part at op {finding.index}: A runs "
            f"{finding.a['op'] if finding.a else 'nothing'}, B runs "
            f"{finding.b['op'] if finding.b else 'nothing'} "
            f"(a data-dependent branch or another code "
            f"path){' at ' + op['line'] if op.get('line') else ''}",
            step,
            finding,
            logs=logs,
        )
    if finding.kind == "argument":
        values = [
            f"{_number(x)} vs {_number(y)}"
            for x, y in zip(finding.a.get("sc", []), finding.b.get("sc", []))
            if x != y
        ]
        return Location(
            f"step {step}: {_where(op)} was given different numbers "
            f"({', '.join(values) or 'a different count of them'}) with identical tensors: the "
            "program asked for different arithmetic (a changed setting), not a nondeterministic op",
            step,
            finding,
            logs=logs,
        )
    if finding.kind == "input":
        source = (
            "a value from outside the recorded operations (a parameter, buffer or tensor "
            "set outside torch ops)"
        )
        return Location(
            f"step {step}: the first difference is an input, not an operation: argument "
            f"{', '.join(map(str, finding.inputs))} of {_where(op)} differs, and it is {source}",
            step,
            finding,
            logs=logs,
        )
    return None


def _measured(
    rerun_a: Rerun, rerun_b: Rerun, step: int, finding: OpFinding, logs: tuple, quiet: bool
) -> Location:
    """The location of an op that produced different outputs from identical inputs, with how far
    apart its first differing output lies (a second, targeted re-run of each side)."""
    op = finding.a or finding.b
    gap: dict[str, Any] = {}
    # A second, targeted re-run of each side saves just this op's outputs, to measure the
    # difference.
    x = _dumped_output(rerun_a, step, finding.index, finding.outputs[0], "a", quiet)
    y = _dumped_output(rerun_b, step, finding.index, finding.outputs[0], "b", quiet)
    if x is not None and y is not None:
        gap = value_gap(x, y)
    size = ""
    if gap.get("max_abs") is not None:
        size = f"; max abs difference {gap['max_abs']:.3g}" + (
            f", {gap['max_ulps']} ulps" if gap.get("max_ulps") is not None else ""
        )
    shape = (
        f"{op['shapes'][finding.outputs[0]]} {op['dtypes'][finding.outputs[0]]}"
        if op.get("shapes")
        else ""
    )
    kind = (
        "random numbers from an RNG that differs"
        if "rand" in op["op"] or "normal" in op["op"] or "bernoulli" in op["op"]
        else "different outputs"
    )
    return Location(
        f"step {step}: {_where(op)} produced {kind} from identical inputs (output {shape}){size}",
        step,
        finding,
        gap,
        logs,
    )


def _number(text: str) -> str:
    """An op log's scalar as a person writes it (floats are kept in hex there)."""
    try:
        return f"{float.fromhex(text):.6g}" if "p" in text else text
    except ValueError:
        return text
