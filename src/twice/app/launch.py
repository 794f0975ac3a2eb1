"""`twice run`: start a command seeded, deterministic and recorded, and write its manifest.

The child's environment is prepared before its interpreter starts (PYTHONHASHSEED,
CUBLAS_WORKSPACE_CONFIG, the bootstrap on PYTHONPATH); the launcher itself never imports torch,
so the torch facts are recorded by the training process where torch really ran.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from twice.app import progress
from twice.app.manifests import finish_manifest, start_manifest
from twice.app.options import DEFAULT_SEED, RunOptions
from twice.app.trust import sign_manifest
from twice.core.errors import CheckpointError, Exit, UsageError, from_os_error
from twice.core.protocol import PER_RUN, ChildSettings
from twice.runtime.determinism import CUBLAS_WORKSPACE, MODES
from twice.runtime.orphans import parent_death_hook
from twice.store.layout import RunFolder
from twice.store.runs import (
    MANIFEST,
    new_run_dir,
    write_json_atomic,
)

__all__ = [
    "RunOptions",
    "run_command",
    "DEFAULT_SEED",
    "child_environment",
    "resolve_command",
    "portable_policy",
]


BOOT_DIR = Path(__file__).resolve().parent.parent / "runtime" / "_boot"


def resolve_command(command: list[str]) -> tuple[list[str], Path | None]:
    """(argv to execute, the Python script it runs if one can be seen); usage errors for bad
    commands."""
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
        check_interpreter(executable)
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
        elif rest[:1] == ["-m"] and len(rest) > 1:
            script = module_file(rest[1])
    return argv, script


def module_file(name: str) -> Path | None:
    """The file `python -m name` runs where it lies in the current folder (first on the path
    of a `-m` run): the module's own file, or a package's `__main__` module; None for a module
    found elsewhere (installed), whose code the environment's packages identify."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    for candidate in (Path(*parts[:-1], parts[-1] + ".py"), Path(*parts, "__main__.py")):
        if candidate.is_file():
            return candidate
    return None


# What a recorded process imports besides twice itself (which the bootstrap finds either way).
_NEEDED = ("xxhash", "numpy", "safetensors", "torch")


def check_interpreter(executable: str) -> None:
    """The command's Python must be able to record itself: when it is not the interpreter twice
    runs in, ask it (without importing anything) whether it has what a recorded process imports.
    Otherwise the run would start, train unrecorded and fail with a ModuleNotFoundError."""
    if os.path.realpath(executable) == os.path.realpath(sys.executable):
        return
    probe = (
        "import importlib.util as u, sys; "
        f"print(','.join(m for m in {_NEEDED!r} if u.find_spec(m) is None))"
    )
    try:
        found = subprocess.run(
            [executable, "-c", probe], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return  # not a Python we can ask: let the run say what it says
    missing = found.stdout.strip()
    if found.returncode == 0 and missing:
        raise UsageError(
            f"the command's python ({executable}) lacks {missing.replace(',', ', ')}, so its "
            "process could not be recorded (or would not start)",
            f"use the python twice runs in: `twice run -- {sys.executable} ...`, or activate "
            "that environment first (then `python` is that one)",
        )


def portable_policy(determinism: str) -> str:
    """Portable mode's policy for uncovered ops under a determinism mode: an error under strict,
    a warning (and a manifest entry) otherwise."""
    return "strict" if determinism == "strict" else "warn"


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
        full_every=options.full_every,
        stop_after=options.stop_after,
        record_ops=options.record_ops or None,
        numerics=options.numerics or None,
        portable=None if options.observe else options.portable,
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


def _stdin_facts() -> dict | None:
    """What the command's standard input (inherited from twice's) is, where it may carry data
    that no hook sees, because the shell opened it: a regular file (`< data.bin`), by path,
    size, mtime and inode, hashed at the run's end like any file read; or a pipe or socket,
    whose data twice cannot see. None for a terminal, /dev/null or none."""
    try:
        info = os.fstat(0)
    except OSError:
        return None
    if stat.S_ISREG(info.st_mode):
        try:
            path = os.readlink("/proc/self/fd/0")
        except OSError:
            path = "<stdin>"
        if not os.path.isabs(path) or path.endswith(" (deleted)"):
            path = "<stdin>"  # not a path to hash: recorded as read and gone
        facts = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "inode": info.st_ino}
        return {"kind": "file", "path": path, **facts}
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        return {"kind": "pipe"}
    return None


def check_resume_source(path: Path) -> None:
    """`--resume PATH` is checked before the command starts: a checkpoint that verifies, or a
    checkpoints folder holding one. Anything else is an error now, not a traceback later."""
    from twice.checkpoint import latest, list_checkpoints, verify
    from twice.checkpoint.folder import INDEX

    if not path.exists():
        raise UsageError(
            f"--resume {path}: no such checkpoint", "`twice checkpoint ls RUN` lists a run's"
        )
    if path.is_dir() and not (path / INDEX).exists() and list_checkpoints(path):
        if latest(path) is None:
            raise CheckpointError(
                f"--resume {path}: none of its checkpoints verifies",
                "`twice checkpoint ls` says why each is damaged; resume from an earlier run",
            )
        return
    verify(path)


def _check_options(options: RunOptions) -> None:
    """A determinism mode twice knows and a seed in range, or a usage error before anything
    runs."""
    if options.determinism not in MODES:
        raise UsageError(
            f"unknown determinism mode {options.determinism!r}", f"use one of: {', '.join(MODES)}"
        )
    if isinstance(options.seed, bool) or not 0 <= options.seed < 2**64:
        raise UsageError(f"seed {options.seed} is out of range", "use an integer from 0 to 2**64-1")


def _open_run_folder(
    run_dir: Path,
    command: list[str],
    argv: list[str],
    script: Path | None,
    cwd: Path,
    options: RunOptions,
    runs_dir: Path,
) -> tuple[dict[str, str], dict, tuple[IO[bytes], IO[bytes]]]:
    """(the command's environment, its first manifest, the opened stdout and stderr logs) of the
    new run folder `run_dir`."""
    try:
        env = child_environment(options, run_dir)
        manifest = start_manifest(run_dir, list(command), script, cwd, options, env, runs_dir)
        context = manifest["context"]
        context["executable"] = argv
        stdin = _stdin_facts()
        if stdin is not None:
            context["stdin"] = stdin
        stdout_log = open(RunFolder(run_dir).stdout, "wb")
        stderr_log = open(RunFolder(run_dir).stderr, "wb")
    except BaseException as exc:  # nothing ran: leave no empty or half-made run folder behind
        shutil.rmtree(run_dir, ignore_errors=True)
        if isinstance(exc, OSError):
            raise from_os_error(exc, f"write run folder {run_dir}") from None
        raise
    return env, manifest, (stdout_log, stderr_log)


class _Ending:
    """How the command ended, filled in as it runs: its exit status (None until it exits) and
    whether Ctrl-C interrupted it."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.interrupted = False


def _start_child(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """The command, started with its output piped to twice."""
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=parent_death_hook(),  # killed with the launcher, never left running
        )
    except OSError as exc:
        raise UsageError(f"cannot start {argv[0]}: {exc.strerror}", "check the command") from exc


def _supervise(
    child: subprocess.Popen,
    run_dir: Path,
    manifest: dict,
    logs: tuple[IO[bytes], IO[bytes]],
    quiet: bool,
    ending: _Ending,
) -> None:
    """Write the manifest with the child's pid, copy its output into `logs` (and onto the
    terminal unless `quiet`) and wait for it to exit, passing Ctrl-C and SIGTERM on to it."""

    # Ctrl-C is caught as a signal from here on, not as KeyboardInterrupt: one arriving while the
    # manifest is written or the threads start (between two bytecodes) would otherwise escape the
    # wait below and leave the run marked failed rather than interrupted.
    def interrupt(signum, frame):
        # the terminal sent SIGINT to the child too; pass it on in case it did not
        ending.interrupted = True
        if child.poll() is None:
            child.send_signal(signal.SIGINT)

    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
    main = threading.current_thread() is threading.main_thread()
    # Started with SIGINT ignored (a background job of a script), the child ignores it too:
    # catching it here would mark the run interrupted while the command runs on.
    ignored = main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    previous = (
        (
            signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else interrupt),
            signal.signal(signal.SIGTERM, forward),
        )
        if main
        else None
    )
    threads = []
    try:
        manifest["context"]["child_pid"] = child.pid
        write_json_atomic(run_dir / MANIFEST, sign_manifest(manifest))
        echo_out = [] if quiet else [sys.stdout.buffer]
        echo_err = [] if quiet else [sys.stderr.buffer]
        threads = [
            threading.Thread(target=_tee, args=(child.stdout, [logs[0], *echo_out]), daemon=True),
            threading.Thread(target=_tee, args=(child.stderr, [logs[1], *echo_err]), daemon=True),
        ]
        for thread in threads:
            thread.start()
        while True:
            try:
                ending.returncode = child.wait()
                break
            except KeyboardInterrupt:  # where no handler could be installed (off the main thread)
                interrupt(signal.SIGINT, None)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
    for thread in threads:
        thread.join()


def run_command(command: list[str], options: RunOptions | None = None) -> tuple[int, Path]:
    """Run `command` under twice and return (its exit code, the run folder)."""
    options = options or RunOptions()
    _check_options(options)
    cwd = Path(options.cwd or os.getcwd())
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        argv, script = resolve_command(command)
    finally:
        os.chdir(saved)
    if options.resume_from is not None:
        check_resume_source(Path(options.resume_from))
    runs_dir = options.runs_dir if Path(options.runs_dir).is_absolute() else cwd / options.runs_dir
    run_dir = new_run_dir(runs_dir, options.name)
    env, manifest, logs = _open_run_folder(run_dir, command, argv, script, cwd, options, runs_dir)
    ending = _Ending()
    progress.run_started(run_dir, options.name, options.stop_after or options.expected_steps)
    try:
        if options.live is not None:
            # before the command starts: a tracking store that fails stops nothing
            options.live.start(run_dir)
        child = _start_child(argv, cwd, env)
        _supervise(child, run_dir, manifest, logs, options.quiet, ending)
    finally:
        for log in logs:
            log.close()
        finish_manifest(run_dir, manifest, ending.returncode, ending.interrupted)
        if options.live is not None:
            options.live.finish(run_dir)
        progress.run_ended(run_dir, ending.returncode)
    returncode = ending.returncode
    if returncode is None:
        returncode = Exit.INTERRUPTED if ending.interrupted else Exit.DIFFER
    return (128 - returncode if returncode < 0 else returncode), run_dir
