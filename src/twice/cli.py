"""The `twice` command line: thin commands that parse, call one library function, print, return."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from twice.core.errors import EXIT_USAGE, TwiceError, UsageError
from twice.store.layout import RunFolder

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _out(text: str = "") -> None:
    click.echo(text)


def _err(text: str) -> None:
    click.echo(text, err=True)


def _style(text: str, **kwargs) -> str:
    if os.environ.get("NO_COLOR") or not sys.stdout.isatty():
        return text
    return click.style(text, **kwargs)


class TwiceGroup(click.Group):
    """Renders every error as `error:` / `hint:` on stderr with exit code 2, never a traceback."""

    def main(self, args=None, prog_name="twice", **kwargs):
        debug = "--debug" in (args if args is not None else sys.argv[1:])
        try:
            return super().main(args=args, prog_name=prog_name, standalone_mode=False, **kwargs)
        except TwiceError as exc:
            if debug:
                raise
            _err(exc.render())
            sys.exit(exc.exit_code)
        except click.exceptions.NoSuchOption as exc:
            hint = f"did you mean {' or '.join(exc.possibilities)}?" if exc.possibilities else None
            command = exc.ctx.command_path if exc.ctx else "twice"
            _err(
                f"error: unknown option {exc.option_name}\nhint: {hint or f'see `{command} --help`'}"
            )
            sys.exit(EXIT_USAGE)
        except click.exceptions.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "twice"
            _err(f"error: {exc.format_message()}\nhint: see `{command} --help`")
            sys.exit(EXIT_USAGE)
        except click.exceptions.Abort:
            _err("error: aborted")
            sys.exit(130)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)


@click.group(cls=TwiceGroup, context_settings=CONTEXT)
@click.version_option(package_name="twice", prog_name="twice")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
def main(debug: bool) -> None:
    """Run PyTorch training twice and get the same bits; when you don't, learn where and why.

    \b
    Examples:
      twice run -- python train.py --lr 0.1
      twice verify runs/<id>
      twice diff runs/<a> runs/<b>
    """


def _runs_dir_option(function):
    return click.option(
        "--runs-dir",
        type=click.Path(path_type=Path),
        default=Path("runs"),
        show_default=True,
        help="Folder holding run folders.",
    )(function)


@main.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option("--seed", type=int, default=None, help="Root seed for every RNG  [default: 0].")
@click.option("--name", help="A label appended to the run id.")
@_runs_dir_option
@click.option(
    "--determinism",
    type=click.Choice(["strict", "warn", "off"]),
    default="strict",
    show_default=True,
    help="strict: refuse what cannot be made deterministic; warn: warn instead; off: seed only.",
)
@click.option(
    "--observe",
    is_flag=True,
    help="Record only: no seeding, no deterministic mode, nothing changed.",
)
@click.option(
    "--trace-every",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Record every N-th step.",
)
@click.option(
    "--params-every",
    type=click.IntRange(min=0),
    default=None,
    help="Per-tensor digests every N steps (0: never)  [default: every step for models of at most 64 tensors, else every 100].",
)
@click.option(
    "--numerics",
    type=click.Choice(["stop", "warn"]),
    default=None,
    is_flag=False,
    flag_value="stop",
    help="Check every operation for NaN/Inf; stop at the first (default) or warn. See `twice nan RUN`.",
)
@click.option(
    "--record-ops",
    metavar="STEPS",
    default=None,
    help="Record every operation of these steps into ops/ (e.g. 3 or 0,10-12), for `twice locate`.",
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=None,
    help="Stop the command after N training steps (twice.Run checkpoints on the way out).",
)
@click.option(
    "--resume",
    "resume_from",
    type=click.Path(path_type=Path),
    default=None,
    help="A checkpoint, checkpoints folder or run whose latest checkpoint twice.Run.resume() starts from.",
)
@click.option(
    "--mlflow",
    "mlflow_uri",
    metavar="URI",
    default=None,
    help="Log to this MLflow tracking store while the command runs (needs twice[mlflow]).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    seed,
    name,
    runs_dir,
    determinism,
    observe,
    trace_every,
    params_every,
    numerics,
    record_ops,
    max_steps,
    resume_from,
    mlflow_uri,
    command,
):
    """Run COMMAND seeded, deterministic and recorded in runs/<id>/.

    The exit code is the command's own.

    \b
    Examples:
      twice run -- python train.py --lr 0.1
      twice run train.py --lr 0.1              (shorthand for a Python script)
      twice run --observe -- bash train.sh     (record only, change nothing)
      twice run --mlflow sqlite:///mlflow.db -- python train.py
    """
    from twice.app.launch import DEFAULT_SEED, RunOptions, run_command

    live = None
    if mlflow_uri is not None:
        from .integrations.mlflow import LiveExport

        live = LiveExport(mlflow_uri)
    if observe and seed is not None:
        raise UsageError(
            "--observe records the run as it is and cannot also seed it", "drop --seed or --observe"
        )
    if resume_from is not None:
        if not resume_from.exists():
            raise UsageError(
                f"nothing to resume from at {resume_from}",
                "pass a checkpoint folder, or a run folder with checkpoints/",
            )
        if RunFolder(resume_from).checkpoints.is_dir():
            resume_from = RunFolder(resume_from).checkpoints
    options = RunOptions(
        seed=DEFAULT_SEED if seed is None else seed,
        name=name,
        runs_dir=runs_dir,
        determinism=determinism,
        observe=observe,
        trace_every=trace_every,
        params_every=params_every,
        resume_from=resume_from,
        stop_after=max_steps,
        record_ops=_steps_option(record_ops),
        numerics=numerics,
        live=live,
    )
    code, run_dir = run_command(list(command), options)
    from twice.store.runs import read_json

    context = read_json(RunFolder(run_dir).manifest)["context"]
    _err(f"twice: run {run_dir} {context['status']} (exit {code})")
    note = trace_cost_note(context, trace_every)
    if note:
        _err(note)
    sys.exit(code)


# `twice run` says what tracing cost when it is at least this share of the run and this many seconds
# (a short run's fraction of a second is not worth a line).
TRACE_COST_NOTE, TRACE_COST_NOTE_SECONDS = 0.05, 1.0


def trace_cost_note(
    context: dict,
    trace_every: int,
    threshold: float = TRACE_COST_NOTE,
    min_seconds: float = TRACE_COST_NOTE_SECONDS,
) -> str | None:
    """The line `twice run` prints when the trace hooks took `threshold` or more of the run's time
    and at least `min_seconds`."""
    cost = context.get("trace_cost")
    if not cost or cost["share"] < threshold or cost["hooks_s"] < min_seconds:
        return None
    every = max(trace_every, 1) * 10
    return (
        f"twice: tracing took {100 * cost['share']:.0f}% of the run's time ({cost['hooks_s']:.1f} s in twice's hooks "
        f"over {cost['wall_s']:.1f} s); --trace-every {every} would trace one step in {every}"
    )


def _steps_option(value: str | None) -> str | None:
    import re

    if value is None:
        return None
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", value):
        raise UsageError(
            f"--record-ops {value!r} is not a list of steps", "give steps like 3 or 0,10-12"
        )
    return value


def _print_comparison(result, as_json: bool) -> None:
    if as_json:
        _out(json.dumps(result.to_json(), indent=2, sort_keys=True))
        return
    colour = "green" if result.identical else "red"
    _out(_style(result.verdict, fg=colour, bold=True))
    if not result.identical:
        _out(f"cause: {result.explanation}")
    elif result.differences:
        _out(f"note: {result.explanation}")
    if result.differences:
        _out("\nidentity differences (A -> B):")
        group = None
        shown: dict[str, int] = {}
        for diff in result.differences:
            shown[diff.group] = shown.get(diff.group, 0) + 1
            if shown[diff.group] > 12:
                continue
            if diff.group != group:
                group = diff.group
                total = sum(1 for d in result.differences if d.group == group)
                _out(f"  {group}:" + (f" ({total}, first 12 shown)" if total > 12 else ""))
            _out(f"    {diff.key}: {diff.a} -> {diff.b}")
    divergence = result.divergence
    if divergence is not None:
        from twice.core.divergence import FIELD_MEANING, loss_gap

        where = "" if divergence.stream == "main" else f", stream {divergence.stream}"
        _out(f"\nfirst divergence: step {divergence.step}{where}, in causal order:")
        for name in divergence.fields:
            detail = ""
            if name == "loss":
                gap = loss_gap(divergence.loss_a, divergence.loss_b)
                detail = f": {divergence.loss_a} vs {divergence.loss_b}"
                if gap.get("abs") is not None:
                    detail += f" (abs {gap['abs']:.3g}" + (
                        f", {gap['ulps']} ulps)" if gap.get("ulps") is not None else ")"
                    )
            elif name == "rng" and divergence.rng_sources:
                detail = f": {', '.join(divergence.rng_sources)}"
            elif name in divergence.tensors:
                names = divergence.tensors[name]
                detail = f": {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
            _out(f"  {FIELD_MEANING[name]}{detail}")
    steps = ", ".join(f"{s}: A {a} / B {b}" for s, (a, b) in result.steps.items())
    _out(
        f"\nrecorded steps: {steps or 'none'}; status: A {result.statuses[0]}, B {result.statuses[1]}"
    )


@main.command()
@click.argument("a")
@click.argument("b")
@_runs_dir_option
@click.option(
    "--steps", type=click.IntRange(min=1), default=None, help="Compare only the first N steps."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--html",
    "html_out",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the HTML report here.",
)
def diff(a, b, runs_dir, steps, as_json, html_out):
    """Compare two runs: the verdict, identity differences, the first divergence and its likely cause.

    Exit 0 when identical, 1 when different.

    \b
    Examples:
      twice diff runs/<a> runs/<b>
      twice diff <id-a> <id-b> --json
    """
    from twice.app.compare import compare_runs
    from twice.store.runs import find_run

    result = compare_runs(find_run(a, runs_dir), find_run(b, runs_dir), steps=steps)
    _print_comparison(result, as_json)
    if html_out is not None:
        from twice.app.report import write_report

        write_report([result.a, result.b], html_out)
        _err(f"twice: report written to {html_out}")
    sys.exit(result.exit_code)


@main.command()
@click.argument("run_ref", metavar="RUN")
@_runs_dir_option
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="Verify only the first N steps (stops the re-run there).",
)
@click.option(
    "--resume-at",
    type=click.IntRange(min=1),
    default=None,
    metavar="STEP",
    help="Instead, run RUN's command interrupted after STEP steps and resumed in a new process, and compare "
    "it with RUN (as verify-resume, RUN being the uninterrupted run).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--quiet", "-q", is_flag=True, help="Do not echo the re-run's output.")
def verify(run_ref, runs_dir, steps, resume_at, as_json, quiet):
    """Run RUN's command again with its seed and settings; exit 0 if every step is bit-identical.

    \b
    Examples:
      twice verify runs/<id>
      twice verify <id> --steps 100
      twice verify <id> --resume-at 50
    """
    from twice.app.verify import verify_run
    from twice.store.runs import find_run

    run_dir = find_run(run_ref, runs_dir)
    if resume_at is not None:
        return _verify_resume_of_run(
            run_dir, resume_at, steps, as_json
        )  # exits with the check's code
    result, new_dir = verify_run(run_dir, steps=steps, quiet=quiet or as_json)
    _err(f"twice: re-run recorded in {new_dir}")
    if not as_json:
        _out(
            _style(
                "reproducible" if result.identical else "NOT reproducible",
                fg="green" if result.identical else "red",
                bold=True,
            )
        )
    _print_comparison(result, as_json)
    sys.exit(result.exit_code)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def env(as_json):
    """This machine's determinism hazards and the facts behind them.

    \b
    Examples:
      twice env
      twice env --json
    """
    from twice.runtime.hazards import machine_hazards

    hazards, facts = machine_hazards()
    if as_json:
        _out(
            json.dumps(
                {"hazards": [h.to_json() for h in hazards], "facts": facts},
                indent=2,
                sort_keys=True,
            )
        )
        return
    _out(
        f"{len(hazards)} determinism hazard{'s' if len(hazards) != 1 else ''} here:"
        if hazards
        else "no determinism hazards found"
    )
    for hazard in hazards:
        _out(f"  {_style(hazard.name, bold=True)}: {hazard.detail}\n    fix: {hazard.fix}")
    torch_facts = facts["torch"]
    _out("\nfacts:")
    _out(
        f"  python {facts['python']['version']}, torch {torch_facts['version']} (CUDA {torch_facts['cuda'] or 'none'}, "
        f"cuDNN {torch_facts['cudnn'] or 'none'}, BLAS {torch_facts['blas'] or 'unknown'})"
    )
    _out(
        f"  cpu: {facts['cpu']['model']} ({facts['cpu']['available']} of {facts['cpu']['count']} cores available)"
    )
    _out(
        f"  threads: {facts['threads']['intra_op_threads']} intra-op, {facts['threads']['inter_op_threads']} inter-op"
    )
    _out(f"  TF32: matmul {facts['tf32']['matmul']}, cuDNN {facts['tf32']['cudnn']}")
    gpus = facts["gpus"]
    _out(
        "  gpus: "
        + (
            ", ".join(
                f"{g['name']} (cc {g['compute_capability']}, driver {g['driver']})" for g in gpus
            )
            if gpus
            else "none"
        )
    )
    env_vars = facts["env"]
    _out(
        "  numerics env: "
        + (", ".join(f"{k}={v}" for k, v in sorted(env_vars.items())) if env_vars else "none set")
    )


def _summary(run_dir: Path) -> dict:
    from twice.store.runs import effective_status, read_json

    manifest = read_json(RunFolder(run_dir).manifest)
    context, identity = manifest["context"], manifest["identity"]
    return {
        "id": run_dir.name,
        "path": str(run_dir),
        "status": effective_status(manifest),
        "exit_code": context.get("exit_code"),
        "steps": context.get("steps"),
        "seed": identity.get("seed"),
        "started": context.get("started"),
        "command": " ".join(identity.get("argv", [])),
    }


@main.command(name="ls")
@click.argument("runs_dir", required=False, type=click.Path(path_type=Path), default=Path("runs"))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(runs_dir, as_json):
    """List the runs in RUNS_DIR (default: runs), oldest first.

    \b
    Examples:
      twice ls
      twice ls experiments/runs --json
    """
    from twice.store.runs import list_runs

    if not runs_dir.is_dir():
        raise UsageError(
            f"no runs folder {runs_dir}",
            "start a run with `twice run`, or pass the folder that holds runs",
        )
    rows = [_summary(path) for path in list_runs(runs_dir)]
    if as_json:
        _out(json.dumps(rows, indent=2, sort_keys=True))
        return
    for row in rows:
        started = (
            time.strftime("%Y-%m-%d %H:%M", time.localtime(row["started"]))
            if row["started"]
            else "?"
        )
        steps = "-" if row["steps"] is None else row["steps"]
        _out(f"{row['id']:<44} {row['status']:<11} {started}  steps {steps:<6} {row['command']}")


@main.command()
@click.argument("run_ref", metavar="RUN")
@_runs_dir_option
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (the whole manifest)."
)
def show(run_ref, runs_dir, as_json):
    """Show one run: status, command, seed, code, environment and trace length.

    \b
    Examples:
      twice show runs/<id>
      twice show <id-prefix> --json
    """
    from twice.store.runs import effective_status, find_run, read_json

    run_dir = find_run(run_ref, runs_dir)
    manifest = read_json(RunFolder(run_dir).manifest)
    if as_json:
        manifest["context"]["effective_status"] = effective_status(manifest)
        _out(json.dumps(manifest, indent=2, sort_keys=True))
        return
    row, identity = _summary(run_dir), manifest["identity"]
    torch_facts = identity.get("torch", {})
    git = identity.get("code", {}).get("git") or {}
    _out(
        f"run {row['id']}: {row['status']}"
        + (f" (exit {row['exit_code']})" if row["exit_code"] is not None else "")
    )
    _out(f"  command: {row['command']}")
    _out(f"  seed: {row['seed']}, determinism: {identity.get('determinism', {}).get('mode')}")
    _out(f"  steps recorded: {row['steps'] if row['steps'] is not None else 'unknown'}")
    if git:
        _out(
            f"  git: {git.get('commit') or 'no commit'} on {git.get('branch')}{' (dirty: code.patch saved)' if git.get('dirty') else ''}"  # noqa: E501
        )
    _out(f"  sources: {len(identity.get('code', {}).get('sources', {}))} local files digested")
    _out(
        f"  python {identity.get('python', {}).get('version')}, torch {torch_facts.get('version', 'not imported')}, "
        f"{len(identity.get('packages', {}))} packages"
    )
    threads = identity.get("threads", {})
    if threads:
        _out(
            f"  threads: {threads.get('intra_op_threads')} intra-op, {threads.get('inter_op_threads')} inter-op"
        )


@main.command(name="verify-resume", context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option(
    "--at",
    type=click.IntRange(min=1),
    default=None,
    help="Interrupt after this many steps  [default: half the run].",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Root seed for every RNG.")
@_runs_dir_option
@click.option(
    "--determinism",
    type=click.Choice(["strict", "warn", "off"]),
    default="strict",
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def verify_resume_command(at, seed, runs_dir, determinism, as_json, command):
    """Check that an interrupted and resumed COMMAND equals the uninterrupted one, bit for bit.

    Runs COMMAND straight; again, stopped after --at steps (a real separate process); then resumed
    in a new process. Exit 0 when the resumed steps and the final state match, 1 otherwise, naming
    the first mismatch and the state that was missing.

    \b
    Examples:
      twice verify-resume -- python train.py
      twice verify-resume --at 100 -- python train.py --epochs 2
    """
    from twice.app.launch import RunOptions
    from twice.app.verify import verify_resume

    options = RunOptions(seed=seed, runs_dir=runs_dir, determinism=determinism, quiet=True)
    _print_resume_check(verify_resume(list(command), options, at=at), as_json)


def _verify_resume_of_run(run_dir, at: int, steps, as_json: bool) -> None:
    """`twice verify RUN --resume-at STEP`: verify-resume with RUN as the uninterrupted run."""
    from twice.app.verify import rerun_options, verify_resume
    from twice.store.runs import MANIFEST, effective_status, read_json

    if steps is not None:
        raise UsageError("--steps and --resume-at check different things", "give one of them")
    manifest = read_json(run_dir / MANIFEST)
    status, stopped = effective_status(manifest), manifest["context"].get("stopped_after")
    if status != "completed" or stopped:
        how = f"was stopped after {stopped} steps" if stopped else f"is {status}"
        raise UsageError(
            f"run {run_dir.name} {how}: it is not the whole uninterrupted run to compare a resume with",
            "record the run to its end, or use `twice verify-resume -- COMMAND`, which runs it straight first",
        )
    command, options = rerun_options(run_dir, name=f"resume-{run_dir.name[:26]}", quiet=True)
    _print_resume_check(
        verify_resume(command, options, at=at, straight=run_dir.resolve(), at_flag="--resume-at"),
        as_json,
    )


def _print_resume_check(result, as_json: bool) -> None:
    if as_json:
        _out(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        _out(_style(result.verdict, fg="green" if result.identical else "red", bold=True))
        if result.cause:
            _out(f"cause: {result.cause}")
        for role, path in result.runs.items():
            _out(f"  {role}: {path}")
    sys.exit(result.exit_code)


@main.group(name="export")
def export_group():
    """Put recorded runs into other tools (MLflow)."""


@export_group.command(name="mlflow")
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True)
@_runs_dir_option
@click.option(
    "--tracking-uri",
    default=None,
    help="The MLflow tracking store  [default: $MLFLOW_TRACKING_URI, else ./mlruns].",
)
@click.option(
    "--experiment", default="twice", show_default=True, help="The MLflow experiment to export into."
)
@click.option(
    "--no-checkpoints", is_flag=True, help="Leave the checkpoints/ folder out of the artifacts."
)
def export_mlflow(run_refs, runs_dir, tracking_uri, experiment, no_checkpoints):
    """Export each RUN to MLflow: hyperparameters and identity as params, the trace as metrics,
    the run folder as artifacts. A run exported before is not exported twice.

    \b
    Examples:
      twice export mlflow runs/<id> --tracking-uri sqlite:///mlflow.db
      twice export mlflow runs/* --experiment lr-study
    """
    from twice.store.runs import find_run

    from .integrations.mlflow import export_run

    for ref in run_refs:
        run_dir = find_run(ref, runs_dir)
        try:
            run_id, created = export_run(
                run_dir,
                tracking_uri=tracking_uri,
                experiment=experiment,
                checkpoints=not no_checkpoints,
            )
        except Exception as exc:  # MLflow's own errors: a store it cannot open or write
            if isinstance(exc, TwiceError) or type(exc).__module__.split(".")[0] != "mlflow":
                raise
            raise UsageError(
                f"MLflow refused the export of {run_dir.name}: {exc}",
                "check --tracking-uri (for example sqlite:///mlflow.db or a http:// server)",
            ) from exc
        _out(f"{run_dir.name} -> mlflow run {run_id}" + ("" if created else " (exported before)"))


@main.group(name="checkpoint")
def checkpoint_group():
    """Inspect checkpoints written by twice.Run.checkpoint() or twice.checkpoint.save()."""


@checkpoint_group.command(name="verify")
@click.argument("path", type=click.Path(path_type=Path))
def checkpoint_verify(path):
    """Check every file of the checkpoint at PATH against its recorded digest (exit 0 valid, 2 not).

    \b
    Examples:
      twice checkpoint verify runs/<id>/checkpoints/step-00000400
    """
    from twice.checkpoint import verify as verify_checkpoint

    index = verify_checkpoint(path)
    if "parts" in index:
        _out(f"checkpoint {path}: valid, {index['world_size']} rank parts")
    else:
        _out(f"checkpoint {path}: valid ({', '.join(sorted(index['entries']))})")


@checkpoint_group.command(name="ls")
@click.argument("run_ref", metavar="RUN")
@_runs_dir_option
def checkpoint_ls(run_ref, runs_dir):
    """List RUN's checkpoints, newest last, each valid or why not.

    \b
    Examples:
      twice checkpoint ls runs/<id>
    """
    from twice.checkpoint import CheckpointError, list_checkpoints
    from twice.checkpoint import verify as verify_checkpoint
    from twice.store.runs import find_run

    run_dir = find_run(run_ref, runs_dir)
    for path in list_checkpoints(RunFolder(run_dir).checkpoints):
        try:
            verify_checkpoint(path)
            _out(f"{path.name}  valid")
        except CheckpointError as exc:
            _out(f"{path.name}  INVALID: {exc.message}")


@main.command()
@click.argument("a")
@click.argument("b")
@_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--verbose", "-v", is_flag=True, help="Echo the re-runs' output.")
def locate(a, b, runs_dir, as_json, verbose):
    """The first operation whose inputs were identical and whose outputs differed between runs A and B.

    Uses op logs recorded with `twice run --record-ops`, or re-runs both runs up to their first
    diverging step with op recording. Exit 0 when the runs do not diverge, 1 otherwise.

    \b
    Examples:
      twice locate runs/<a> runs/<b>
      twice locate <id-a> <id-b> --json
    """
    from twice.app.locate import locate_runs
    from twice.store.runs import find_run

    run_a, run_b = find_run(a, runs_dir), find_run(b, runs_dir)
    result = locate_runs(run_a, run_b, quiet=not verbose)
    from twice.store.files import write_json_atomic

    write_json_atomic(
        run_a / f"locate-{run_b.name}.json", result.to_json()
    )  # shown by `twice report`
    if as_json:
        _out(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        _out(result.sentence)
        if result.logs:
            _out(f"op logs: {result.logs[0]}\n         {result.logs[1]}")
    sys.exit(result.exit_code)


@main.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="How many steps to record twice.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Root seed for every RNG.")
@_runs_dir_option
@click.option(
    "--determinism",
    type=click.Choice(["strict", "warn", "off"]),
    default="warn",
    show_default=True,
    help="warn (default) lets nondeterministic kernels run so that they can be seen.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def audit(steps, seed, runs_dir, determinism, as_json, command):
    """List the nondeterminism COMMAND really hits: ops that gave different bits from identical inputs
    in two runs of its first steps, and ops it runs that are nondeterministic on CUDA. Exit 1 if any.

    \b
    Examples:
      twice audit -- python train.py
      twice audit --steps 3 -- python train.py --lr 0.1
    """
    from twice.app.launch import RunOptions
    from twice.app.locate import audit_command

    report = audit_command(
        list(command),
        RunOptions(seed=seed, runs_dir=runs_dir, determinism=determinism, quiet=True),
        steps=steps,
    )
    if as_json:
        _out(json.dumps(report.to_json(), indent=2, sort_keys=True))
        sys.exit(report.exit_code)
    seen = set()
    rows = []
    for finding in report.differing:
        op = finding.a
        key = (op["op"], op.get("module"), op.get("line"))
        if key not in seen:
            seen.add(key)
            rows.append(
                f"  {op['op']} in {op.get('module') or '?'} ({op['phase']}) at {op.get('line') or '?'}, first at step {op['step']}"  # noqa: E501
            )
    _out(
        f"{len(rows)} operation{'s' if len(rows) != 1 else ''} gave different bits from identical inputs in {steps} steps run twice:"  # noqa: E501
        if rows
        else f"no operation gave different bits from identical inputs in {steps} steps run twice"
    )
    for row in rows:
        _out(row)
    if report.cuda_hazards:
        _out(
            f"{len(report.cuda_hazards)} operation(s) this model runs are nondeterministic on CUDA:"
        )
        for name, info in sorted(report.cuda_hazards.items()):
            _out(
                f"  {name} in {info.get('module') or '?'} at {info.get('line') or '?'}: {info['fix']}"
            )
    sys.exit(report.exit_code)


@main.command()
@click.argument("run_ref", metavar="RUN")
@_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def nan(run_ref, runs_dir, as_json):
    """Show RUN's numerical health: where its first NaN/Inf came from and the warnings before it.

    Exit 0 when the run recorded no fault, 1 when it did.

    \b
    Examples:
      twice nan runs/<id>
      twice nan <id> --json
    """
    from twice.store.faults import read_numerics as read_report
    from twice.store.runs import find_run

    report, events = read_report(find_run(run_ref, runs_dir))
    faults = [e for e in events if e["kind"] == "non_finite"]
    if as_json:
        _out(json.dumps({"report": report, "events": events}, indent=2, sort_keys=True))
        sys.exit(1 if report or faults else 0)
    if report is None and not faults:
        _out(f"no NaN or Inf recorded; {len(events)} warning{'s' if len(events) != 1 else ''}")
        for event in events[:20]:
            _out(f"  step {event['step']}: {event['summary']}")
        sys.exit(0)
    if report is not None:
        fault = report["fault"]
        _out(
            _style(
                f"{fault['value']} at step {fault['step']}: {fault['op']} ({fault['phase']}"
                f"{', ' + fault['module'] if fault.get('module') else ''}) at {fault.get('line') or '?'}",
                fg="red",
                bold=True,
            )
        )
        _out("chain of causes, first cause first:")
        for number, event in enumerate(report["chain"], start=1):
            where = " ".join(
                x
                for x in (
                    event.get("module") and f"in {event['module']}",
                    event.get("line") and f"at {event['line']}",
                )
                if x
            )
            _out(
                f"  {number}. step {event['step']}: {event['summary']}{' ' + where if where else ''}"
            )
            if event.get("fix"):
                _out(f"     fix: {event['fix']}")
    else:
        _out(
            _style(
                f"non-finite values recorded from step {faults[0]['step']}: {faults[0]['summary']}",
                fg="red",
                bold=True,
            )
        )
        _out("(run with `twice run --numerics` to find the operation and line)")
    sys.exit(1)


@main.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option(
    "--vary",
    "vary",
    multiple=True,
    metavar="NAME=V1,V2",
    help="A setting and its values (repeatable: a grid).",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Seeds per arm (0..N-1, the same for every arm).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Trials run at once.",
)
@click.option(
    "--metric",
    default="final_loss",
    show_default=True,
    help="final_loss, best_loss, or a name the script logs.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: processes on this machine; ray: Ray tasks (needs twice[ray], a shared filesystem).",
)
@click.option(
    "--ray-address", default=None, help="An existing Ray cluster (default: start a local one)."
)
@click.option(
    "--name",
    default=None,
    help="The sweep folder's name under --runs-dir  [default: from the settings].",
)
@_runs_dir_option
@click.option(
    "--determinism",
    type=click.Choice(["strict", "warn", "off"]),
    default="strict",
    show_default=True,
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def sweep(vary, seeds, jobs, metric, executor, ray_address, name, runs_dir, determinism, command):
    """Run COMMAND for every combination of --vary values times --seeds seeds, each a recorded run.

    {name} in COMMAND is replaced by each value ({seed} too). Re-running the same sweep skips
    completed trials and retries failed ones; Ctrl-C leaves completed trials intact.

    \b
    Examples:
      twice sweep --vary lr=0.1,0.01 --seeds 5 -- python train.py --lr {lr}
      twice sweep --vary lr=0.1,0.01 --vary wd=0,1e-4 --seeds 3 -j 2 -- python train.py --lr {lr} --wd {wd}
    """
    import re

    from twice.app.launch import RunOptions
    from twice.app.sweep import parse_vary, plan_trials, run_sweep

    grid = parse_vary(list(vary))
    plan_trials(grid, seeds, list(command))  # validate before creating anything
    label = name or re.sub(r"[^A-Za-z0-9_.=-]", "_", "sweep-" + "-".join(grid))
    folder = Path(runs_dir) / label
    tty = sys.stderr.isatty()

    def progress(done, total, running, failed, eta):
        left = f", ~{eta:.0f} s left" if eta is not None else ""
        line = f"twice sweep: {done}/{total} done, {running} running, {failed} failed{left}"
        click.echo(("\r" + line + " " * 8) if tty else line, err=True, nl=not tty)

    outcome = run_sweep(
        folder,
        grid,
        seeds,
        list(command),
        jobs=jobs,
        metric=metric,
        options=RunOptions(runs_dir=runs_dir, determinism=determinism),
        progress=progress,
        executor=executor,
        ray_address=ray_address,
    )
    if tty:
        click.echo("", err=True)
    _out(
        f"sweep {folder}: {outcome.completed} trials completed ({outcome.skipped} from before), {len(outcome.failed)} failed"
    )
    for failure in outcome.failed:
        _out(f"  failed: {failure}")
    if outcome.interrupted:
        _err("twice: interrupted; run the same command again to continue")
    sys.exit(outcome.exit_code)


@main.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--metric", default=None, help="The metric to compare  [default: the sweep's].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--html",
    "html_out",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the HTML report here.",
)
def stats(folder, metric, as_json, html_out):
    """Each arm's mean and 95% CI, and for each pair of arms whether the effect exceeds seed noise.

    \b
    Examples:
      twice stats runs/sweep-lr
      twice stats runs/sweep-lr --metric best_loss --json
    """
    from itertools import combinations

    from twice.app.sweep import sweep_results
    from twice.core.stats import compare_pair, summarize_arm

    spec, values = sweep_results(folder, metric)
    arms = [summarize_arm(arm, per_seed) for arm, per_seed in values.items()]
    pairs = [compare_pair(a, b) for a, b in combinations(arms, 2)]
    if html_out is not None:
        from twice.app.report import write_report

        write_report([folder], html_out)
        _err(f"twice: report written to {html_out}")
    if as_json:
        _out(
            json.dumps(
                {
                    "metric": spec["metric"],
                    "arms": [a.to_json() for a in arms],
                    "pairs": [p.to_json() for p in pairs],
                },
                indent=2,
                sort_keys=True,
            )
        )
        return
    _out(f"metric: {spec['metric']}")
    for arm in arms:
        _out(
            f"  {arm.arm:<30} n={arm.n}  mean {arm.mean:.6g}  sd {arm.std:.3g}  95% CI [{arm.ci_low:.6g}, {arm.ci_high:.6g}]"
        )
    for pair in pairs:
        p_w = "n/a" if pair.p_wilcoxon is None else f"{pair.p_wilcoxon:.3g}"
        needed = (
            ""
            if pair.seeds_needed is None
            else f"; {pair.seeds_needed} seeds resolve this difference at 80% power"
        )
        _out(
            f"{pair.b} vs {pair.a}: {pair.verdict}: difference {pair.mean_difference:+.6g} "
            f"(95% CI [{pair.ci_low:.6g}, {pair.ci_high:.6g}]), paired t p={pair.p_t:.3g}, Wilcoxon p={p_w}, "
            f"d_z={pair.effect_size:.3g}{needed}"
        )


@main.command()
@click.argument("paths", nargs=-1, required=True)
@_runs_dir_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("report.html"),
    show_default=True,
)
def report(paths, runs_dir, output):
    """Write one self-contained HTML page about RUNs (compared with the first) or a SWEEP folder.

    \b
    Examples:
      twice report runs/<a> runs/<b> -o report.html
      twice report runs/sweep-lr -o sweep.html
    """
    from twice.app.report import write_report
    from twice.app.sweep import SWEEP_FILE
    from twice.store.runs import find_run

    resolved = [
        Path(p) if (Path(p) / SWEEP_FILE).is_file() else find_run(p, runs_dir) for p in paths
    ]
    _out(f"report written to {write_report(resolved, output)}")


@main.command()
@click.argument("a")
@click.argument("b")
@_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def bisect(a, b, runs_dir, as_json):
    """The first diverging step of runs recorded with a coarse trace (--trace-every K), by replays.

    Each replay re-runs both runs up to a middle step (from a checkpoint before it when there is
    one) and fingerprints only that step: ceil(log2(K)) replays instead of tracing every step.
    Exit 0 when the runs do not diverge, 1 otherwise.

    \b
    Examples:
      twice bisect runs/<a> runs/<b>
    """
    from twice.app.locate import bisect_divergence
    from twice.store.runs import find_run

    result = bisect_divergence(find_run(a, runs_dir), find_run(b, runs_dir))
    if as_json:
        _out(json.dumps(result.to_json(), indent=2, sort_keys=True))
    elif result.step is None:
        _out("runs do not diverge")
    else:
        low, high = result.interval
        _out(
            f"first divergence at step {result.step} (between recorded steps {low} and {high}; {result.replays} replays)"
        )
    sys.exit(0 if result.step is None else 1)
