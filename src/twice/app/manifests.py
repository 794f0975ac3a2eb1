"""Writing a run's manifest: identity and context as the run starts, what its processes recorded as
it ends.

The manifest is written atomically at both moments, so a run killed in between still has one
(status `running`, which `effective_status` turns into `crashed` once the launcher is gone).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from twice.app.options import RunOptions
from twice.app.trust import sign_manifest
from twice.core.digests import digest
from twice.core.errors import CorruptRecord
from twice.runtime.capture import (
    env_digests,
    gather_context_facts,
    gather_identity_facts,
    git_state,
    numeric_env,
)
from twice.runtime.reads import OVERFLOW, STARTED
from twice.store import reader
from twice.store.inputs import coverage, hash_inputs, inputs_under, python_program
from twice.store.layout import MANIFEST, RunFolder
from twice.store.outputs import written_files
from twice.store.procs import ProcessRecord, read_processes
from twice.store.runs import process_start_time, write_bytes_atomic, write_json_atomic
from twice.store.traceseries import loss_fault

SOURCE_LIMIT = 64 << 20  # a source file or script hashed: larger is no source

__all__ = ["start_manifest", "finish_manifest", "SCHEMA"]

SCHEMA = 1


def _status_for(returncode: int | None, interrupted: bool) -> str:
    if interrupted or returncode in (-signal.SIGINT, 130, -signal.SIGTERM):
        return "interrupted"
    if returncode == 0:
        return "completed"
    if returncode is not None and returncode < 0:
        return "crashed"
    return "failed"


def _merge_processes(run_dir: Path, identity: dict, base: Path) -> dict:
    """Fold what each Python process of the command recorded (procs/<pid>.json) into the
    identity; a record a process left damaged is skipped and named in the context."""
    procs, refused = read_processes(run_dir)
    sources = {}
    for proc in procs:
        for source in proc.sources:
            path = Path(source)
            try:
                key = path.relative_to(base).as_posix()
            except ValueError:
                key = str(path)
            try:  # a crafted record may name a FIFO or /dev/zero: refused, never read
                sources[key] = digest(reader.read_input(path, SOURCE_LIMIT))
            except (OSError, CorruptRecord):
                sources[key] = None
    identity["code"]["sources"] = dict(sorted(sources.items()))
    ranks = [
        p.distributed for p in procs if p.distributed and p.distributed.get("rank") is not None
    ]
    if ranks:
        identity["distributed"] = {
            "world_size": max(r.get("world_size", 1) for r in ranks),
            "backend": next((r.get("backend") for r in ranks if r.get("backend")), None),
            "ranks_recorded": sorted(r["rank"] for r in ranks),
        }
        sharded = min(
            (r for r in ranks if r.get("sharding")), key=lambda r: r["rank"], default=None
        )
        if sharded is not None:  # the same on every rank (SPMD): the lowest rank's
            identity["distributed"]["sharding"] = sharded["sharding"]
    main = next((p for p in procs if p.torch and p.steps), None) or next(
        (p for p in procs if p.torch), None
    )
    if main is not None:
        identity["torch"] = main.torch
        runtime = main.torch_runtime
        identity["threads"] = {
            k: runtime[k] for k in ("intra_op_threads", "inter_op_threads") if k in runtime
        }
        if "cuda_devices" in runtime:
            identity["cuda_devices"] = runtime["cuda_devices"]
        if main.determinism and main.determinism.get("settings"):
            settings = main.determinism["settings"]
            identity["determinism"]["in_effect"] = {k: v["in_effect"] for k, v in settings.items()}
            problems = {k: v["reason"] for k, v in settings.items() if v.get("reason")}
            if problems:
                identity["determinism"]["problems"] = problems
    uncovered: dict[str, dict] = {}
    compiled = 0
    for proc in procs:
        for entry in (proc.portable or {}).get("uncovered", []):
            known = uncovered.setdefault(entry["op"], {**entry, "count": 0})
            known["count"] += entry.get("count", 0)
        compiled += (proc.portable or {}).get("compiled_eagerly", 0)
    summary = {
        **(
            {"portable_uncovered": sorted(uncovered.values(), key=lambda e: e["op"])}
            if uncovered
            else {}
        ),
        **({"portable_compiled_eagerly": compiled} if compiled else {}),
        "processes": len(procs),
        "steps": main.steps if main else None,
        "stopped_after": main.stopped_after if main else None,
        "trace_cost": _trace_cost(main),
        "events": _events(procs),
        "seeding": _seeding(procs),
    }
    if refused:
        summary["damaged_process_records"] = refused
    return summary


def _record_inputs(run_dir: Path, identity: dict, context: dict) -> None:
    """Every file the run's processes read, wherever it lies (store/inputs.py): digests in the
    identity (compared: a changed data file is a difference), Python sources read as data
    (`exec(open(...).read())`, runpy) with the code, details and coverage in the context."""
    procs, _ = read_processes(run_dir)
    if all(proc.reads is None for proc in procs):
        return  # no process watched its reads (twice.Run outside `twice run`): none recorded
    reads: dict[str, list[int]] = {}
    started: dict[str, int] = {}  # program -> 1 if it inherited twice's settings
    for proc in procs:
        for path, facts in (proc.reads or {}).items():
            if path.startswith(STARTED):
                program = path.removeprefix(STARTED)
                started[program] = min(started.get(program, 1), facts[0])
            else:
                reads.setdefault(path, facts)
    unrecorded = reads.pop(OVERFLOW, None) is not None
    stdin = context.get("stdin") or {}
    if stdin.get("kind") == "file":  # opened by the shell (`< data.bin`): no hook saw it
        reads.setdefault(stdin["path"], [stdin["size"], stdin["mtime_ns"], stdin["inode"]])
    runs = run_dir.resolve().parent
    exclude = [*context.get("inputs_exclude", []), str(runs)]
    cwd = Path(context["cwd"]).resolve()
    # a source a process imported, or the script itself, is in the code record already
    imported = {os.path.realpath(source) for proc in procs for source in proc.sources}
    script = identity["code"].get("script")
    if script:
        imported.add(os.path.realpath(cwd / script["path"]))
    kept = {
        path: facts
        for path, facts in inputs_under(reads, ["/"], exclude).items()
        if not (path.endswith(".py") and os.path.realpath(path) in imported)
    }
    files = hash_inputs(
        kept,
        str(cwd),
        roots=context.get("inputs_roots") or [context["cwd"]],
        started=context.get("started"),
        ended=time.time(),
    )
    identity["inputs"] = {f.path: f.identity() for f in files if not (f.code or f.made_by_run)}
    as_code = {f.path: f.identity() for f in files if f.code and not f.made_by_run}
    if as_code:
        identity["code"]["read_as_data"] = as_code
    context["inputs"] = [f.to_json() for f in files]
    python = {program: python_program(program) for program in started}
    context["inputs_coverage"] = coverage(
        files,
        unrecorded,
        stdin_pipe=stdin.get("kind") == "pipe",
        not_python=[os.path.basename(p) for p in started if not python[p]],
        unwatched_python=[os.path.basename(p) for p, w in started.items() if python[p] and not w],
    )


def _outputs(run_dir: Path, context: dict) -> dict:
    """The files the command wrote under its working folder (store/outputs.py), leaving out the
    runs folder (or only this run's, when the runs folder holds the working folder)."""
    cwd, runs = Path(context["cwd"]).resolve(), run_dir.resolve().parent
    exclude = [run_dir] if cwd == runs or runs in cwd.parents else [runs]
    try:
        return written_files(cwd, float(context.get("started") or time.time()), exclude)
    except OSError:
        return {}


def _events(procs: list[ProcessRecord]) -> dict | None:
    """What the recorder's hooks saw, summed over the run's processes (None: no process was
    recorded): a run with no step says from this which hooks fired."""
    seen = [proc.events for proc in procs if proc.events is not None]
    if not seen:
        return None
    return {key: sum(events.get(key, 0) for events in seen) for key in _EVENT_COUNTS}


_EVENT_COUNTS = ("batches", "backward_calls", "optimizer_steps", "steps")


def _seeding(procs: list[ProcessRecord]) -> dict:
    """The script's own seeding calls (runtime/seedcalls.py), summed over the run's processes by
    API and line: their values' digests combined in sorted order, so that processes started in
    another order (ranks, spawned workers) give the same record; and the APIs the processes
    watched (a process watches an API once it imports its module)."""
    sites: dict[tuple[str, str], list[dict]] = {}
    watched: set[str] = set()
    for proc in procs:
        if proc.seeding is None:
            continue
        watched.update(proc.seeding["watched"])
        for call in proc.seeding["calls"]:
            sites.setdefault((call["api"], call["site"]), []).append(call)
    calls = []
    for (api, site), found in sorted(sites.items()):
        values = sorted(c["values"] for c in found if c["values"] is not None)
        calls.append(
            {
                "api": api,
                "site": site,
                "calls": sum(c["calls"] for c in found),
                "values": digest("\n".join(values)) if values else None,
                "entropy": sum(c["entropy"] for c in found),
            }
        )
    return {"calls": calls, "watched": sorted(watched)}


def _trace_cost(proc: ProcessRecord | None) -> dict | None:
    """Time the training process spent in twice's trace hooks, against its whole life."""
    if not proc or proc.trace_cost_s is None or not proc.ended or not proc.started:
        return None
    wall = max(
        round(proc.ended - proc.started, 3), 1e-3
    )  # the share is of the wall time as recorded
    return {
        "hooks_s": proc.trace_cost_s,
        "wall_s": wall,
        "share": round(proc.trace_cost_s / wall, 4),
    }


def start_manifest(
    run_dir: Path,
    argv: list[str],
    script: Path | None,
    cwd: Path,
    options: RunOptions,
    env: dict[str, str],
    runs_dir: Path,
) -> dict:
    """Capture the identity and context of a run that is starting and write its manifest (status
    running)."""
    started = time.time()
    git, patch = git_state(cwd, exclude=[runs_dir])
    if patch:
        write_bytes_atomic(RunFolder(run_dir).code_patch, patch.encode("utf-8", "surrogateescape"))
    code = {
        "git": None
        if git is None
        else {
            **{k: git[k] for k in ("commit", "branch", "dirty")},
            "patch": digest(patch) if patch else None,
            "untracked_by_digest": git["untracked_by_digest"],
        }
    }
    if script is not None:
        code["script"] = {"path": script.as_posix(), "digest": _script_digest(cwd / script)}
    identity = {
        "schema": SCHEMA,
        "argv": list(argv),
        "code": code,
        "seed": None if options.observe else options.seed,
        "observe": options.observe,
        "determinism": {
            "mode": "observe" if options.observe else options.determinism,
            **({"portable": True} if options.portable and not options.observe else {}),
        },
        **gather_identity_facts(),
        "env": numeric_env(env),
    }
    facts = gather_context_facts()
    launcher = {
        "pid": os.getpid(),
        "host": facts["host"],
        "start_time": process_start_time(os.getpid()),
    }
    context = {
        **facts,
        "cwd": str(cwd),
        "started": started,
        "status": "running",
        "launcher": launcher,
        "git_root": git["root"] if git else None,
        "trace_every": options.trace_every,
        "params_every": options.params_every,
        "full_every": options.full_every,
        "stop_after": options.stop_after,
        "recording": {
            "trace_every": options.trace_every,
            "params_every": options.params_every,
            "full_every": options.full_every,
            "max_steps": options.stop_after,
            "record_ops": options.record_ops or None,
            "numerics": options.numerics,
            "inputs": list(options.inputs),
            "inputs_exclude": list(options.inputs_exclude),
            "mlflow": options.live is not None,
        },
        "inputs_roots": [str(Path(cwd).resolve()), *options.inputs],
        "inputs_exclude": list(options.inputs_exclude),
        "env_digests": env_digests(env),
        "capture_seconds": round(time.time() - started, 4),
    }
    manifest = {"identity": identity, "context": context}
    write_json_atomic(run_dir / MANIFEST, sign_manifest(manifest))
    return manifest


def _script_digest(path: Path) -> str | None:
    try:
        return digest(reader.read_input(path, SOURCE_LIMIT))
    except (OSError, CorruptRecord):
        return None


def finish_manifest(
    run_dir: Path, manifest: dict, returncode: int | None, interrupted: bool
) -> None:
    """Fold in what the processes recorded, set the final status, and rewrite the manifest
    atomically."""
    identity, context = manifest["identity"], manifest["context"]
    summary = _merge_processes(run_dir, identity, Path(context.get("git_root") or context["cwd"]))
    config_path = RunFolder(run_dir).config
    try:
        fault = loss_fault(run_dir)
    except CorruptRecord:  # the trace's own damage is diff's and verify's to report
        fault = None
    if fault is not None:
        summary["loss_fault"] = fault
    summary["outputs"] = _outputs(run_dir, context)
    _record_inputs(run_dir, identity, context)
    if reader.present(config_path):
        try:
            config = reader.read_json(config_path)
            if not isinstance(config, dict):
                raise CorruptRecord(f"{config_path} is not a JSON object")
            identity["config"] = config
        except CorruptRecord:  # the manifest must still be finished: say so, do not crash
            summary["damaged_config"] = True
    # The closed set of streams this run wrote: a trace file it does not list is never merged.
    context["streams"] = sorted(RunFolder(run_dir).traces())
    context.update(
        ended=time.time(),
        exit_code=returncode,
        status=_status_for(returncode, interrupted),
        **summary,
    )
    if returncode is not None and returncode < 0:
        context["signal"] = signal.Signals(-returncode).name
    if summary.get("stopped_after"):
        context["status"] = "stopped"
    write_json_atomic(run_dir / MANIFEST, sign_manifest(manifest))
