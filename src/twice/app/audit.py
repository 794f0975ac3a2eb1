"""`twice audit`: run a command's first steps twice with every op recorded, and name the ops that
gave different bits from identical inputs here, and every call site of an op that is
nondeterministic on CUDA."""

from __future__ import annotations

from dataclasses import dataclass

from twice.app.launch import RunOptions, run_command
from twice.app.locate import describe_op
from twice.core.errors import Exit, UsageError
from twice.core.opdiff import OpFinding, differing_ops
from twice.store.layout import RunFolder
from twice.store.oplogs import steps_ops

__all__ = ["audit_command", "AuditReport", "CUDA_NONDETERMINISTIC", "AUDIT_TARGETS"]

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


@dataclass
class AuditReport:
    """What `audit_command` found: ops that were nondeterministic here, and ops known to be on
    CUDA (each with every call site that ran it). `target` is what the gate is for: "here" fails
    only on what was observed, "cuda" also on what would be nondeterministic on a GPU."""

    differing: list[OpFinding]
    cuda_hazards: dict[str, dict]
    steps: int
    runs: tuple[str, str]
    target: str = "here"

    @property
    def exit_code(self) -> int:
        """1 when an op gave different bits here (or, for --for cuda, when one would on CUDA)."""
        if self.differing:
            return 1
        return Exit.DIFFER if self.target == "cuda" and self.cuda_hazards else Exit.SAME

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "steps": self.steps,
            "runs": list(self.runs),
            "for": self.target,
            "nondeterministic_here": [
                {**describe_op(f.a), "step": f.a.get("step")} for f in self.differing
            ],
            "cuda_nondeterministic": self.cuda_hazards,
        }


AUDIT_TARGETS = ("here", "cuda")


def audit_command(
    command: list[str], options: RunOptions, steps: int = 2, target: str = "here"
) -> AuditReport:
    """Run the first `steps` steps twice with every op recorded; list ops that differed from
    identical inputs, and every call site of an op that is nondeterministic on CUDA."""
    if target not in AUDIT_TARGETS:
        raise UsageError(f"unknown audit target {target!r}", "use --for here or --for cuda")
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
            if name not in CUDA_NONDETERMINISTIC:
                continue
            hazard = hazards.setdefault(name, {"fix": CUDA_NONDETERMINISTIC[name], "sites": []})
            site = {"module": op.get("module"), "line": op.get("line"), "phase": op["phase"]}
            if not any(
                {k: s[k] for k in ("module", "line", "phase")} == site for s in hazard["sites"]
            ):
                hazard["sites"].append({**site, "step": step})
    if not any(RunFolder(d).ops.is_dir() for d in dirs):
        raise UsageError(
            "the command recorded no training step",
            "audit needs a script that trains with torch.optim or twice.Run",
        )
    return AuditReport(differing, hazards, steps, (str(dirs[0]), str(dirs[1])), target)
