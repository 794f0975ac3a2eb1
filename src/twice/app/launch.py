"""`twice run`: start a command seeded, deterministic and recorded, and write its manifest.

The child's environment is prepared before its interpreter starts (PYTHONHASHSEED,
CUBLAS_WORKSPACE_CONFIG, the bootstrap on PYTHONPATH); the launcher itself never imports torch,
so the torch facts are recorded by the training process where torch really ran.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from twice.core.digests import digest
from twice.core.errors import UsageError
from twice.core.protocol import PER_RUN, ChildSettings
from twice.runtime.capture import (
    gather_context_facts,
    gather_identity_facts,
    git_state,
    numeric_env,
)
from twice.runtime.determinism import CUBLAS_WORKSPACE, MODES
from twice.store.layout import RunFolder
from twice.store.runs import (
    MANIFEST,
    new_run_dir,
    process_start_time,
    read_json,
    write_bytes_atomic,
    write_json_atomic,
)

__all__ = ["RunOptions", "run_command", "DEFAULT_SEED", "child_environment", "resolve_command"]


# The documented default: two plain `twice run`s of a script compare equal.
DEFAULT_SEED = 0
BOOT_DIR = Path(__file__).resolve().parent.parent / "runtime" / "_boot"
SCHEMA = 1


@dataclass
class RunOptions:
    """Everything `twice run` takes besides the command; each field is one command-line option."""

    seed: int = DEFAULT_SEED
    """The root seed given to every RNG (ignored with observe)."""
    name: str | None = None
    """A label appended to the run id."""
    runs_dir: Path = Path("runs")
    """Where run folders are created."""
    determinism: str = "strict"
    """strict: refuse what cannot be made deterministic; warn: warn instead; off: seed only."""
    observe: bool = False
    """Record only: no seeding, no deterministic mode, no environment changes."""
    trace_every: int = 1
    """Record every N-th step."""
    params_every: int | None = None
    """Per-tensor digests every N steps (None: auto, see instrument.AUTO_PARAMS_TENSORS)."""
    stop_after: int | None = None
    """Stop the command after this many steps (used by `twice verify --steps`)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables to set in the child besides the launcher's own (used by verify)."""
    unset_env: tuple[str, ...] = ()
    """Variables to remove from the child's environment (used by verify)."""
    cwd: Path | None = None
    """Where to run the command (default: here)."""
    quiet: bool = False
    """Save the command's output without also echoing it."""
    numerics: str | None = None
    """Full numerics watch in the command: "stop" at the first NaN/Inf, or "warn"."""
    record_ops: str | None = None
    """Steps whose every operation is recorded into ops/ (e.g. "3,10-12")."""
    resume_from: Path | None = None
    """A checkpoint (or checkpoints folder) that twice.Run.resume() in the command starts from."""
    live: Any = None
    """Something told of the run as it goes: live.start(run_dir) once the command started,
    live.finish(run_dir) after its manifest is final (twice run --mlflow)."""


def resolve_command(command: list[str]) -> tuple[list[str], Path | None]:
    """(argv to execute, the Python script it runs if one can be seen); usage errors for bad commands."""
    if not command:
        raise UsageError(
            "no command to run", "put the command after --, e.g. `twice run -- python train.py`"
        )
    argv = list(command)
    if argv[0].endswith(".py"):
        # The shorthand `twice run train.py ARGS` runs the script with this interpreter.
        argv = [sys.executable, *argv]
    executable = shutil.which(argv[0])
    if executable is None:
        hint = "check the spelling, or give the full path"
        if Path(argv[0]).exists():
            hint = f"{argv[0]} is not executable: run it through its interpreter, or chmod +x it"
        raise UsageError(f"command not found: {argv[0]}", hint)
    script = None
    if Path(argv[0]).name.startswith("python"):
        rest = argv[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest = rest[1:]
        if rest and rest[0] not in ("-m", "-c"):
            script = Path(rest[0])
            if not script.is_file():
                raise UsageError(
                    f"script not found: {script}",
                    "check the path; it is relative to the current folder",
                )
    return argv, script


def child_environment(options: RunOptions, run_dir: Path) -> dict[str, str]:
    """The environment of the command: set before its interpreter starts, so it takes effect."""
    # The launcher owns the contract's variables: none leaks in from an outer `twice run`.
    owned = set(ChildSettings.variables(launcher_only=True)) | set(PER_RUN)
    env = {k: v for k, v in os.environ.items() if k not in options.unset_env and k not in owned}
    folder = RunFolder(run_dir.resolve())
    settings = ChildSettings(
        run_dir=str(folder.path),
        seed=None if options.observe else options.seed,
        determinism=None if options.observe else options.determinism,
        observe=options.observe,
        trace_every=options.trace_every,
        params_every=options.params_every,
        stop_after=options.stop_after,
        record_ops=options.record_ops or None,
        numerics=options.numerics or None,
        checkpoint_dir=str(folder.checkpoints),
        resume_from=str(Path(options.resume_from).resolve())
        if options.resume_from is not None
        else None,
    )
    env.update(settings.to_env())
    env.update(options.env)  # the caller's own: verify's recorded settings, locate's op to dump
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *filter(None, [env.get("PYTHONPATH")])])
    if options.observe:
        return env
    # Both only work when set before the interpreter (hash seed) or cuBLAS (workspace) starts.
    env.setdefault("PYTHONHASHSEED", "0")
    if options.determinism != "off":
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    if options.determinism == "strict":
        # NCCL picks its reduction algorithm and protocol by message size and topology; pinned, the
        # order of floating-point additions in an all-reduce is fixed. (No effect without NCCL.)
        env.setdefault("NCCL_ALGO", "Ring")
        env.setdefault("NCCL_PROTO", "Simple")
    return env


def _tee(source: IO[bytes], sinks: list) -> None:
    for chunk in iter(lambda: source.read1(65536), b""):
        for sink in sinks:
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                pass
    source.close()


def _status_for(returncode: int | None, interrupted: bool) -> str:
    if interrupted or returncode in (-signal.SIGINT, 130, -signal.SIGTERM):
        return "interrupted"
    if returncode == 0:
        return "completed"
    if returncode is not None and returncode < 0:
        return "crashed"
    return "failed"


def _merge_processes(run_dir: Path, identity: dict, base: Path) -> dict:
    """Fold what each Python process of the command recorded (procs/<pid>.json) into the identity."""
    procs = []
    for path in sorted(RunFolder(run_dir).procs.glob("*.json")):
        try:
            procs.append(read_json(path))
        except Exception:  # noqa: BLE001 - a process killed mid-write leaves nothing usable; skip it
            continue
    procs.sort(key=lambda p: p.get("started", 0))
    sources = {}
    for proc in procs:
        for source in proc.get("sources", []):
            path = Path(source)
            try:
                key = path.relative_to(base).as_posix()
            except ValueError:
                key = str(path)
            try:
                sources[key] = digest(path.read_bytes())
            except OSError:
                sources[key] = None
    identity["code"]["sources"] = dict(sorted(sources.items()))
    ranks = [
        p["distributed"]
        for p in procs
        if p.get("distributed") and p["distributed"].get("rank") is not None
    ]
    if ranks:
        identity["distributed"] = {
            "world_size": max(r["world_size"] for r in ranks),
            "backend": next((r.get("backend") for r in ranks if r.get("backend")), None),
            "ranks_recorded": sorted(r["rank"] for r in ranks),
        }
    main = next((p for p in procs if p.get("torch") and p.get("steps")), None) or next(
        (p for p in procs if p.get("torch")), None
    )
    if main is not None:
        identity["torch"] = main["torch"]
        runtime = main.get("torch_runtime") or {}
        identity["threads"] = {
            k: runtime[k] for k in ("intra_op_threads", "inter_op_threads") if k in runtime
        }
        if "cuda_devices" in runtime:
            identity["cuda_devices"] = runtime["cuda_devices"]
        if main.get("determinism"):
            settings = main["determinism"]["settings"]
            identity["determinism"]["in_effect"] = {k: v["in_effect"] for k, v in settings.items()}
            problems = {k: v["reason"] for k, v in settings.items() if v["reason"]}
            if problems:
                identity["determinism"]["problems"] = problems
    return {
        "processes": len(procs),
        "steps": main.get("steps") if main else None,
        "stopped_after": main.get("stopped_after") if main else None,
        "trace_cost": _trace_cost(main),
    }


def _trace_cost(proc: dict | None) -> dict | None:
    """Time the training process spent in twice's trace hooks, against its whole life."""
    if (
        not proc
        or proc.get("trace_cost_s") is None
        or not proc.get("ended")
        or not proc.get("started")
    ):
        return None
    wall = max(
        round(proc["ended"] - proc["started"], 3), 1e-3
    )  # the share is of the wall time as recorded
    return {
        "hooks_s": proc["trace_cost_s"],
        "wall_s": wall,
        "share": round(proc["trace_cost_s"] / wall, 4),
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
    """Capture the identity and context of a run that is starting and write its manifest (status running)."""
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
        }
    }
    if script is not None:
        code["script"] = {"path": script.as_posix(), "digest": digest((cwd / script).read_bytes())}
    identity = {
        "schema": SCHEMA,
        "argv": list(argv),
        "code": code,
        "seed": None if options.observe else options.seed,
        "observe": options.observe,
        "determinism": {"mode": "observe" if options.observe else options.determinism},
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
        "stop_after": options.stop_after,
        "capture_seconds": round(time.time() - started, 4),
    }
    manifest = {"identity": identity, "context": context}
    write_json_atomic(run_dir / MANIFEST, manifest)
    return manifest


def finish_manifest(
    run_dir: Path, manifest: dict, returncode: int | None, interrupted: bool
) -> None:
    """Fold in what the processes recorded, set the final status, and rewrite the manifest atomically."""
    identity, context = manifest["identity"], manifest["context"]
    summary = _merge_processes(run_dir, identity, Path(context.get("git_root") or context["cwd"]))
    config_path = RunFolder(run_dir).config
    if config_path.is_file():
        identity["config"] = read_json(config_path)
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
    write_json_atomic(run_dir / MANIFEST, manifest)


def run_command(command: list[str], options: RunOptions | None = None) -> tuple[int, Path]:
    """Run `command` under twice and return (its exit code, the run folder)."""
    options = options or RunOptions()
    if options.determinism not in MODES:
        raise UsageError(
            f"unknown determinism mode {options.determinism!r}", f"use one of: {', '.join(MODES)}"
        )
    if isinstance(options.seed, bool) or not 0 <= options.seed < 2**64:
        raise UsageError(f"seed {options.seed} is out of range", "use an integer from 0 to 2**64-1")
    cwd = Path(options.cwd or os.getcwd())
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        argv, script = resolve_command(command)
    finally:
        os.chdir(saved)
    runs_dir = options.runs_dir if Path(options.runs_dir).is_absolute() else cwd / options.runs_dir
    run_dir = new_run_dir(runs_dir, options.name)
    env = child_environment(options, run_dir)

    manifest = start_manifest(run_dir, list(command), script, cwd, options, env, runs_dir)
    context = manifest["context"]
    context["executable"] = argv

    stdout_log = open(RunFolder(run_dir).stdout, "wb")
    stderr_log = open(RunFolder(run_dir).stderr, "wb")
    interrupted = False
    returncode = None
    try:
        if options.live is not None:
            options.live.start(
                run_dir
            )  # before the command starts: a tracking store that fails stops nothing
        try:
            child = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise UsageError(
                f"cannot start {argv[0]}: {exc.strerror}", "check the command"
            ) from exc

        # Ctrl-C is caught as a signal from here on, not as KeyboardInterrupt: one arriving while the
        # manifest is written or the threads start (between two bytecodes) would otherwise escape
        # the wait below and leave the run marked failed rather than interrupted.
        def interrupt(signum, frame):
            nonlocal interrupted
            interrupted = (
                True  # the terminal sent SIGINT to the child too; pass it on in case it did not
            )
            if child.poll() is None:
                child.send_signal(signal.SIGINT)

        forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
        main = threading.current_thread() is threading.main_thread()
        previous = (
            (signal.signal(signal.SIGINT, interrupt), signal.signal(signal.SIGTERM, forward))
            if main
            else None
        )
        threads = []
        try:
            context["child_pid"] = child.pid
            write_json_atomic(run_dir / MANIFEST, manifest)
            echo_out = [] if options.quiet else [sys.stdout.buffer]
            echo_err = [] if options.quiet else [sys.stderr.buffer]
            threads = [
                threading.Thread(
                    target=_tee, args=(child.stdout, [stdout_log, *echo_out]), daemon=True
                ),
                threading.Thread(
                    target=_tee, args=(child.stderr, [stderr_log, *echo_err]), daemon=True
                ),
            ]
            for thread in threads:
                thread.start()
            while True:
                try:
                    returncode = child.wait()
                    break
                except (
                    KeyboardInterrupt
                ):  # where no handler could be installed (off the main thread)
                    interrupt(signal.SIGINT, None)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous[0])
                signal.signal(signal.SIGTERM, previous[1])
        for thread in threads:
            thread.join()
    finally:
        stdout_log.close()
        stderr_log.close()
        finish_manifest(run_dir, manifest, returncode, interrupted)
        if options.live is not None:
            options.live.finish(run_dir)
    if returncode is None:
        returncode = 130 if interrupted else 1
    return (128 - returncode if returncode < 0 else returncode), run_dir
