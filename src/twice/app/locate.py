"""`twice locate` and `twice audit`: the operation, module and line where runs first compute
different bits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twice.app.compare import compare_runs
from twice.app.launch import RunOptions, run_command
from twice.app.verify import rerun_options
from twice.core.errors import UsageError
from twice.core.opdiff import OpFinding, differing_ops, first_op_difference, value_gap
from twice.core.protocol import ChildSettings
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder
from twice.store.oplogs import step_ops, steps_ops

__all__ = ["Location", "locate_runs", "audit_command", "AuditReport", "CUDA_NONDETERMINISTIC"]

# Operations PyTorch documents as nondeterministic on CUDA, and what to do about each.
# https://pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html
CUDA_NONDETERMINISTIC = {
    "aten::index_add": "uses atomicAdd on CUDA; deterministic algorithms mode selects a sorted "
    "implementation",
    "aten::index_add_": "uses atomicAdd on CUDA; deterministic algorithms mode selects a sorted "
    "implementation",
    "aten::scatter_add": "atomicAdd on CUDA; use deterministic algorithms mode (sorted scatter) "
    "or a one-hot matmul",
    "aten::scatter_add_": "atomicAdd on CUDA; use deterministic algorithms mode (sorted scatter) "
    "or a one-hot matmul",
    "aten::scatter_reduce": "atomic reductions on CUDA; deterministic algorithms mode, or reduce "
    "with sorted segments",
    "aten::index_put_": "with accumulate=True uses atomics on CUDA; deterministic algorithms "
    "mode sorts first",
    "aten::_index_put_impl_": "with accumulate=True uses atomics on CUDA; deterministic "
    "algorithms mode sorts first",
    "aten::put_": "with accumulate=True uses atomics on CUDA",
    "aten::embedding_dense_backward": "atomicAdd on CUDA; deterministic algorithms mode uses a "
    "sorted kernel",
    "aten::_embedding_bag_backward": "atomicAdd on CUDA; no deterministic CUDA kernel: run it on "
    "the CPU or avoid mode='max'",
    "aten::convolution_backward": "cuDNN may choose a nondeterministic algorithm; set "
    "cudnn.deterministic=True (twice run does)",
    "aten::cudnn_convolution": "cuDNN benchmark mode may pick different algorithms per run; "
    "cudnn.benchmark=False (twice run does)",
    "aten::upsample_bilinear2d_backward": "atomicAdd on CUDA; no deterministic kernel: consider "
    "nearest or a transposed conv",
    "aten::upsample_linear1d_backward": "atomicAdd on CUDA; no deterministic kernel",
    "aten::upsample_trilinear3d_backward": "atomicAdd on CUDA; no deterministic kernel",
    "aten::adaptive_avg_pool2d_backward": "atomicAdd on CUDA; no deterministic kernel",
    "aten::adaptive_max_pool2d_backward": "atomicAdd on CUDA; no deterministic kernel",
    "aten::avg_pool3d_backward": "atomicAdd on CUDA; no deterministic kernel",
    "aten::max_pool3d_with_indices_backward": "atomicAdd on CUDA; no deterministic kernel",
    "aten::nll_loss2d_forward": "nondeterministic on CUDA; no deterministic kernel",
    "aten::ctc_loss": "the CUDA backward is nondeterministic",
    "aten::_ctc_loss_backward": "nondeterministic on CUDA",
    "aten::histc": "atomicAdd on CUDA; compute on the CPU, or use torch.bincount with "
    "deterministic mode",
    "aten::bincount": "with weights, atomicAdd on CUDA; deterministic algorithms mode",
    "aten::kthvalue": "nondeterministic on CUDA",
    "aten::median": "the CUDA index output is nondeterministic",
    "aten::grid_sampler_2d_backward": "atomicAdd on CUDA; no deterministic kernel",
    "aten::cumsum": "nondeterministic on CUDA for some dtypes; deterministic algorithms mode",
}


def _describe(op: dict | None) -> dict:
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
        return 0 if self.finding is None else 1

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
                "a": _describe(self.finding.a),
                "b": _describe(self.finding.b),
            },
        }


def _op_log(run_dir: Path, step: int, label: str, quiet: bool) -> tuple[list[dict], str]:
    """The run's op records of `step` and where they are, recording them by re-running the run up
    to that step if its op log does not hold it."""
    records = step_ops(Path(run_dir), step)
    if records is not None:
        return records, f"{Path(run_dir) / 'ops'} (step {step})"
    command, options = rerun_options(
        Path(run_dir),
        name=f"locate-{label}-{Path(run_dir).name[:26]}",
        steps=step + 1,
        quiet=quiet,
        record_ops=str(step),
    )
    _, new_dir = run_command(command, options)
    records = step_ops(new_dir, step)
    if records is None:
        raise UsageError(
            f"re-running {run_dir} did not reach step {step}", f"see {new_dir}/stderr.log"
        )
    return records, f"{new_dir / 'ops'} (step {step})"


def _dumped_output(run_dir: Path, step: int, index: int, output: int, label: str, quiet: bool):
    """Re-run `run_dir` to step `step` saving op `index`'s outputs; return output `output`, or
    None."""
    from safetensors import safe_open

    command, options = rerun_options(
        Path(run_dir),
        name=f"locate-dump-{label}-{Path(run_dir).name[:26]}",
        steps=step + 1,
        quiet=quiet,
        record_ops=str(step),
    )
    options.env = {**options.env, **ChildSettings(dump_op=f"{step}:{index}").to_env()}
    _, new_dir = run_command(command, options)
    values = RunFolder(new_dir).dumped_output(step, index)
    if not values.is_file():
        return None
    with safe_open(str(values), "pt") as handle:
        key = f"{index}.{output}"
        return handle.get_tensor(key) if key in handle.keys() else None


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


def _replay_fingerprint(run_dir: Path, step: int, label: str, quiet: bool):
    """Re-run `run_dir` up to `step` (from its latest checkpoint before it, when it has one)
    recording only that step."""
    import twice.checkpoint as checkpoints
    from twice.store.traces import read_trace

    command, options = rerun_options(
        Path(run_dir), name=f"bisect-{label}-{step}", steps=step + 1, quiet=quiet
    )
    options.env = {**options.env, **ChildSettings(trace_steps=str(step)).to_env()}
    earlier = [
        p
        for p in checkpoints.list_checkpoints(RunFolder(run_dir).checkpoints)
        if int(p.name.split("-")[1]) <= step
    ]
    if earlier:
        options.resume_from = earlier[-1]
    _, new_dir = run_command(command, options)
    record = next((r for r in read_trace(RunFolder(new_dir).trace()) if r.step == step), None)
    if record is None:
        raise UsageError(
            f"replaying {run_dir} did not reach step {step}", f"see {new_dir}/stderr.log"
        )
    return record


def bisect_divergence(a: Path, b: Path, quiet: bool = True) -> Bisection:
    """First diverging step of runs whose traces are coarse (--trace-every K), in ceil(log2(K))
    replays.

    Between the last recorded step where both runs agree and the first where they differ, each
    replay re-runs both up to the middle step, fingerprints only that step, and halves the interval.
    """
    from twice.core.divergence import first_divergence
    from twice.store.traces import read_trace

    comparison = compare_runs(a, b)
    if comparison.divergence is None:
        return Bisection(None, 0)
    high = comparison.divergence.step
    agreed = [r.step for r in read_trace(RunFolder(a).trace()) if r.step < high]
    low = max(agreed) if agreed else -1
    interval, replays = (low, high), 0
    while high - low > 1:
        middle = (low + high) // 2
        record_a = _replay_fingerprint(a, middle, "a", quiet)
        record_b = _replay_fingerprint(b, middle, "b", quiet)
        replays += 1
        if first_divergence([record_a], [record_b]) is None:
            low = middle
        else:
            high = middle
    return Bisection(high, replays, interval)


def locate_runs(a: Path, b: Path, quiet: bool = True) -> Location:
    """Find the first diverging step of runs A and B, then the first operation in it that differs;
    the finding is kept in A's folder (`twice report` shows it)."""
    result = _locate(Path(a), Path(b), quiet)
    write_json_atomic(RunFolder(a).location(Path(b).name), result.to_json())
    return result


def _locate(a: Path, b: Path, quiet: bool) -> Location:
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
    (ops_a, log_a), (ops_b, log_b) = _op_log(a, step, "a", quiet), _op_log(b, step, "b", quiet)
    finding = first_op_difference(ops_a, ops_b)
    logs = (log_a, log_b)
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
    gap: dict[str, Any] = {}
    # A second, targeted re-run of each side saves just this op's outputs, to measure the
    # difference.
    x = _dumped_output(a, step, finding.index, finding.outputs[0], "a", quiet)
    y = _dumped_output(b, step, finding.index, finding.outputs[0], "b", quiet)
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


@dataclass
class AuditReport:
    """What `audit_command` found: ops that were nondeterministic here, and ops known to be on
    CUDA."""

    differing: list[OpFinding]
    cuda_hazards: dict[str, dict]
    steps: int
    runs: tuple[str, str]

    @property
    def exit_code(self) -> int:
        """The command's exit code: 0 when nothing differs or failed, 1 otherwise."""
        return 1 if self.differing or self.cuda_hazards else 0

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "steps": self.steps,
            "runs": list(self.runs),
            "nondeterministic_here": [
                {**_describe(f.a), "step": f.a.get("step")} for f in self.differing
            ],
            "cuda_nondeterministic": self.cuda_hazards,
        }


def audit_command(command: list[str], options: RunOptions, steps: int = 2) -> AuditReport:
    """Run the first `steps` steps twice with every op recorded; list ops that differed from
    identical inputs."""
    from dataclasses import replace

    record = f"0-{steps - 1}"
    dirs = []
    for label in ("audit-a", "audit-b"):
        code, run_dir = run_command(
            command, replace(options, name=label, stop_after=steps, record_ops=record)
        )
        dirs.append(run_dir)
    differing, hazards = [], {}
    logs_a, logs_b = (steps_ops(run_dir, range(steps)) for run_dir in dirs)  # each log read once
    for step in range(steps):
        log_a, log_b = logs_a[step], logs_b[step]
        if log_a is None or log_b is None:
            continue
        for finding in differing_ops(log_a, log_b):
            finding.a["step"] = step
            differing.append(finding)
        for op in log_a:
            name = op["op"].split(".")[0]
            if name in CUDA_NONDETERMINISTIC and name not in hazards:
                hazards[name] = {
                    "fix": CUDA_NONDETERMINISTIC[name],
                    "module": op.get("module"),
                    "line": op.get("line"),
                    "phase": op["phase"],
                    "step": step,
                }
    if not any(RunFolder(d).ops.is_dir() for d in dirs):
        raise UsageError(
            "the command recorded no training step",
            "audit needs a script that trains with torch.optim or twice.Run",
        )
    return AuditReport(differing, hazards, steps, (str(dirs[0]), str(dirs[1])))
