"""The run folder's layout: one property per file, the only place where its file names are spelled.

runs/<id>/
  manifest.json          identity (compared) and context (never compared)
  config.json            hyperparameters the script gave twice.Run(config=...)
  trace.jsonl            one record per step (trace.<stream>.jsonl per rank or forked process)
  stdout.log stderr.log  the command's output
  code.patch             uncommitted changes to the script's repository
  metrics.jsonl          twice.log_metric series; metrics.json: final values
  numerics.jsonl         numerical warnings; numerics.json: the NaN/Inf report
  capture_error.json     when an error of twice's own stopped the step capture
  replicas.json          when data-parallel replicas fell out of sync
  resumed.json           when the run restored a checkpoint: which, and the step it went on from
  verify-segments.json   what `twice verify --segments` checked
  procs/<pid>.json       one record of facts per process, merged into the manifest at exit
  checkpoints/step-<n>/  see twice.checkpoint
  ops/ops[.<stream>].jsonl  op-level logs of chosen steps, and dumped op outputs
"""

from __future__ import annotations

from pathlib import Path

from twice.core.manifest_schema import STREAM

__all__ = ["RunFolder", "MANIFEST", "CAPTURE_ERROR", "STREAM"]

MANIFEST = "manifest.json"
CAPTURE_ERROR = "capture_error.json"


class RunFolder:
    """Paths of the files in one run folder (nothing is read or written here)."""

    __slots__ = ("path",)

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    manifest = property(lambda self: self.path / MANIFEST)
    config = property(lambda self: self.path / "config.json")
    # The defaults of the config's settings, where an integration knows them (the HF Trainer's).
    config_defaults = property(lambda self: self.path / "config_defaults.json")
    stdout = property(lambda self: self.path / "stdout.log")
    stderr = property(lambda self: self.path / "stderr.log")
    code_patch = property(lambda self: self.path / "code.patch")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    final_metrics = property(lambda self: self.path / "metrics.json")
    numerics_events = property(lambda self: self.path / "numerics.jsonl")
    numerics_report = property(lambda self: self.path / "numerics.json")
    capture_error = property(lambda self: self.path / CAPTURE_ERROR)
    replicas = property(lambda self: self.path / "replicas.json")
    resumed = property(lambda self: self.path / "resumed.json")
    checkpoints = property(lambda self: self.path / "checkpoints")
    ops = property(lambda self: self.path / "ops")
    segments_check = property(lambda self: self.path / "verify-segments.json")
    procs = property(lambda self: self.path / "procs")

    def proc_record(self, pid: int) -> Path:
        """The facts of process `pid`, merged into the manifest at exit."""
        return self.procs / f"{pid}.json"

    def proc_records(self) -> list[Path]:
        """Every process's record present, by name."""
        return sorted(self.procs.glob("*.json"))

    def trace(self, stream: str | None = None) -> Path:
        """The trace of one stream: the main process's, or a rank's or forked process's."""
        return self.path / (
            f"trace.{stream}.jsonl" if stream and stream != "main" else "trace.jsonl"
        )

    @staticmethod
    def claimed_trace(trace: Path, attempt: int) -> Path:
        """Where a process writes when `trace` is another live process's (`attempt`: 1, 2, ...):
        trace.<stream>.sub<attempt>.jsonl, a stream of its own."""
        return trace.with_name(f"{trace.name.removesuffix('.jsonl')}.sub{attempt}.jsonl")

    def traces(self) -> dict[str, Path]:
        """The traces present, by stream: "main" for trace.jsonl, else the tag of
        trace.<tag>.jsonl. Only those names: `trace_orig.jsonl` or `trace~.jsonl` is no stream
        (what a run wrote is the closed set its manifest lists: store.traces.trace_files)."""
        out = {}
        for path in sorted(self.path.glob("trace*.jsonl")):
            tag = path.name[len("trace.") : -len(".jsonl")] if path.name != "trace.jsonl" else ""
            if path.name == "trace.jsonl":
                out["main"] = path
            elif path.name.startswith("trace.") and tag != "main" and STREAM.fullmatch(tag):
                out[tag] = path
        return out

    def op_log(self, stream: str | None = None) -> Path:
        """The op log of one stream (recorded steps appended, one file per process)."""
        return self.ops / (f"ops.{stream}.jsonl" if stream else "ops.jsonl")

    def legacy_op_log(self, step: int) -> Path:
        """The op log of one step, as twice wrote it before the per-process file."""
        return self.ops / f"step-{step}.jsonl"

    def location(self, other: str) -> Path:
        """What `twice locate` found comparing this run with run `other` (shown by `twice
        report`)."""
        return self.path / f"locate-{other}.json"

    def locations(self) -> list[Path]:
        """The `twice locate` findings kept in this run folder."""
        return sorted(self.path.glob("locate-*.json"))

    def dumped_output(self, step: int, index: int) -> Path:
        """The outputs of op `index` of `step`, saved by `twice locate`'s re-run."""
        return self.ops / self.dumped_output_name(step, index)

    @staticmethod
    def dumped_output_name(step: int, index: int) -> str:
        """The file name of the outputs of op `index` of `step`."""
        return f"step-{step}-op-{index}.safetensors"
