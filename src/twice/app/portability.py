"""`twice audit --portable`: the operations a command runs that portable mode does not cover."""

from __future__ import annotations

from dataclasses import dataclass, replace

from twice.app.launch import RunOptions, run_command
from twice.core.errors import Exit
from twice.store.runs import read_manifest

__all__ = [
    "PortableAudit",
    "portable_audit",
    "format_portable_audit",
    "core_coverage",
    "format_core_coverage",
]


@dataclass
class PortableAudit:
    """What one portable pass over a command's first steps found."""

    uncovered: list[dict]
    """Each uncovered op: "op", "count", "module", "line", "why"."""
    steps: int | None
    run_dir: str
    exit_code: int | None
    compiled_eagerly: int = 0
    """How many `torch.compile` calls portable mode ran eagerly."""

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints)."""
        return {
            "uncovered": self.uncovered,
            "steps": self.steps,
            "run": self.run_dir,
            "command_exit_code": self.exit_code,
            "compiled_eagerly": self.compiled_eagerly,
        }

    @property
    def status(self) -> int:
        """0: every operation covered; 1: some are not."""
        return Exit.DIFFER if self.uncovered else Exit.SAME


def portable_audit(command: list[str], options: RunOptions, steps: int) -> PortableAudit:
    """Run the command's first `steps` steps in portable mode, listing (not refusing) every op it
    does not cover."""
    code, run_dir = run_command(
        command, replace(options, name="audit-portable", stop_after=steps, portable="audit")
    )
    manifest = read_manifest(run_dir)
    uncovered = manifest.context.get("portable_uncovered") or []
    compiled = manifest.context.get("portable_compiled_eagerly") or 0
    return PortableAudit(uncovered, manifest.steps, str(run_dir), code, compiled)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def format_portable_audit(found: PortableAudit) -> str:
    """`twice audit --portable`: every op portable mode did not cover, where it ran, and why."""
    steps = (
        f"the first {found.steps} step{'s' if found.steps != 1 else ''}"
        if found.steps
        else "the run"
    )
    compiled = (
        f"\ntorch.compile: {_count(found.compiled_eagerly, 'compiled function')} ran eagerly "
        "through portable mode (compiled kernels would bypass it; the manifest records it)"
        if found.compiled_eagerly
        else ""
    )
    if not found.uncovered:
        return (
            f"every operation of {steps} is covered by portable mode: under "
            "`twice run --portable` they give the same bits on any CPU and thread count" + compiled
        )
    lines = [
        f"{_count(len(found.uncovered), 'operation')} of {steps} "
        f"{'is' if len(found.uncovered) == 1 else 'are'} not covered by portable mode "
        "(their bits may depend on the machine):"
    ]
    for entry in found.uncovered:
        where = " ".join(
            part
            for part in (
                f"in {entry['module']}" if entry.get("module") else "",
                f"at {entry['line']}" if entry.get("line") else "",
            )
            if part
        )
        why = f" ({entry['why']})" if entry.get("why") else ""
        lines.append(f"  {entry['op']}{why} {where}, {_count(entry.get('count', 0), 'call')}")
    lines.append(
        "under `twice run --portable` these raise an error with --determinism strict, and run "
        "with torch's kernels (listed in the manifest) with --determinism warn"
    )
    return "\n".join(lines) + compiled


def core_coverage() -> dict:
    """How portable mode covers each overload of PyTorch's Core ATen opset: {"torch": version,
    "ops": [{"op", "how", "detail"}], "counts": {how: n}}."""
    import torch

    from twice.portable.dispatch import mode, routes

    del mode  # imported for its kernels: they register as it loads
    ops = [
        {
            "op": f"aten::{routes.overload_name(op)}",
            "how": routes.coverage(op),
            "detail": routes.describe(op),
        }
        for op in routes.core_overloads()
    ]
    counts: dict[str, int] = {}
    for entry in ops:
        counts[entry["how"]] = counts.get(entry["how"], 0) + 1
    return {"torch": torch.__version__, "ops": ops, "counts": counts}


def format_core_coverage(found: dict) -> str:
    """One line per core overload, then the totals."""
    width = max(len(e["op"]) for e in found["ops"]) if found["ops"] else 0
    lines = [f"{e['op']:<{width}}  {e['detail']}" for e in found["ops"]]
    total = len(found["ops"])
    covered = total - found["counts"].get("uncovered", 0)
    parts = ", ".join(f"{n} {how}" for how, n in sorted(found["counts"].items()))
    lines.append(
        f"{covered} of the {total} Core ATen overloads of torch {found['torch']} are covered "
        f"({parts}); float32 and float64, float16 and bfloat16 through float32"
    )
    return "\n".join(lines)
