"""Commands that run things: `run`, `verify`, `verify-resume`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from twice.app.render import (
    format_resume_check,
    format_segments,
    format_trace_cost_note,
    format_verify,
)
from twice.cli.group import (
    CONTEXT,
    determinism_option,
    echo_err,
    echo_out,
    json_option,
    json_text,
    main,
    quiet_option,
    reporting,
    runs_dir_option,
    seed_option,
    trusting,
    use_color,
    verbose_option,
    yes_option,
)
from twice.core.errors import UsageError
from twice.store.layout import RunFolder
from twice.store.traceseries import loss_fault_phrase


@main.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@seed_option
@click.option("--name", help="A label appended to the run id.")
@runs_dir_option
@determinism_option
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
    help="Per-tensor digests every N steps (0: never)  [default: every step for models of at "
    "most 64 tensors, else every 100].",
)
@click.option(
    "--full-every",
    type=click.IntRange(min=1),
    default=None,
    help="Every N steps, also digest the parameters as whole tensors (each DTensor gathered), "
    "so that runs on different meshes or world sizes can be compared where the arithmetic "
    "allows it  [default: never].",
)
@click.option(
    "--numerics",
    type=click.Choice(["stop", "warn"]),
    default=None,
    is_flag=False,
    flag_value="stop",
    help="Check every operation for NaN/Inf; stop at the first (default) or warn. See `twice nan "
    "RUN`.",
)
@click.option(
    "--portable",
    is_flag=True,
    help="Compute every operation whose bits depend on the machine with twice's portable kernels: "
    "the same bits at any thread count, instruction set or BLAS (see docs/portable.md).",
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
    help="A checkpoint, checkpoints folder or run whose latest checkpoint twice.Run.resume() "
    "starts from.",
)
@click.option(
    "--mlflow",
    "mlflow_uri",
    metavar="URI",
    default=None,
    help="Log to this MLflow tracking store while the command runs (needs twice[mlflow]).",
)
@click.option(
    "--inputs",
    "inputs",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Also record the files read under this folder (repeatable; the working folder always).",
)
@click.option(
    "--inputs-exclude",
    "inputs_exclude",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Do not record the files read under this folder (repeatable).",
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
    full_every,
    numerics,
    portable,
    record_ops,
    max_steps,
    resume_from,
    mlflow_uri,
    inputs,
    inputs_exclude,
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
    from twice.app.launch import RunOptions, portable_policy, run_command
    from twice.app.options import root_seed

    live = None
    if mlflow_uri is not None:
        from twice.integrations.mlflow import LiveExport

        live = LiveExport(mlflow_uri)
        live.open()
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
        seed=root_seed(seed),
        name=name,
        runs_dir=runs_dir,
        determinism=determinism,
        observe=observe,
        trace_every=trace_every,
        params_every=params_every,
        full_every=full_every,
        resume_from=resume_from,
        stop_after=max_steps,
        record_ops=_steps_option(record_ops),
        numerics=numerics,
        portable=portable_policy(determinism) if portable and not observe else None,
        live=live,
        inputs=tuple(str(p.resolve()) for p in inputs),
        inputs_exclude=tuple(str(p.resolve()) for p in inputs_exclude),
    )
    code, run_dir = run_command(list(command), options)
    from twice.store.runs import read_manifest

    context = read_manifest(run_dir).context
    fault = context.get("loss_fault")
    echo_err(
        f"twice: run {run_dir} {context['status']} (exit {code})"
        + (f"; {loss_fault_phrase(fault)}: see `twice nan {run_dir}`" if fault else "")
    )
    note = format_trace_cost_note(context, trace_every)
    if note:
        echo_err(note)
    sys.exit(code)


def _steps_option(value: str | None) -> str | None:
    import re

    if value is None:
        return None
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", value):
        raise UsageError(
            f"--record-ops {value!r} is not a list of steps", "give steps like 3 or 0,10-12"
        )
    return value


@main.command()
@click.argument("run_ref", metavar="RUN")
@runs_dir_option
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
    help="Instead, run RUN's command interrupted after STEP steps and resumed in a new process, "
    "and compare "
    "it with RUN (as verify-resume, RUN being the uninterrupted run).",
)
@click.option(
    "--segments",
    metavar="K|all",
    default=None,
    help="Instead, re-run K segments between RUN's checkpoints (the first and last always, the "
    "rest drawn with --seed) and compare each with the recorded steps and checkpoints.",
)
@seed_option
@click.option(
    "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Segments at a time."
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where segments run: here, or as Ray tasks (RAY_ADDRESS's cluster, else a local one).",
)
@json_option
@quiet_option
@verbose_option
@yes_option
def verify(
    run_ref,
    runs_dir,
    steps,
    resume_at,
    segments,
    seed,
    jobs,
    executor,
    as_json,
    quiet,
    verbose,
    yes,
):
    """Run RUN's command again with its seed and settings; exit 0 if every step is bit-identical.

    \b
    Examples:
      twice verify runs/<id>
      twice verify <id> --steps 100
      twice verify <id> --resume-at 50
      twice verify <id> --segments 4 --jobs 2
    """
    from twice.store.runs import find_run

    run_dir = find_run(run_ref, runs_dir)
    with reporting("verify", quiet):
        _verify(run_dir, steps, resume_at, segments, seed, jobs, executor, as_json, verbose, yes)


def _verify(run_dir, steps, resume_at, segments, seed, jobs, executor, as_json, verbose, yes):
    from twice.app.verify import verify_resume_of_run, verify_run
    from twice.store.runs import read_manifest

    if segments is not None:
        from twice.app.segments import verify_segments

        if steps is not None or resume_at is not None:
            raise UsageError(
                "--segments re-runs parts of the whole run", "drop --steps and --resume-at"
            )
        if segments != "all" and not segments.isdigit():
            raise UsageError(f"--segments takes a count or 'all', not {segments!r}", "e.g. 4")
        count = None if segments == "all" else int(segments)
        check = trusting(
            lambda ok: verify_segments(run_dir, count, seed, jobs=jobs, executor=executor, yes=ok),
            yes,
        )
        echo_out(json_text(check.to_json()) if as_json else format_segments(check, use_color()))
        sys.exit(check.exit_code)
    if resume_at is not None:
        if steps is not None:
            raise UsageError("--steps and --resume-at check different things", "give one of them")
        check = trusting(lambda ok: verify_resume_of_run(run_dir, resume_at, yes=ok), yes)
        echo_out(json_text(check.to_json()) if as_json else format_resume_check(check, use_color()))
        sys.exit(check.exit_code)
    result, new_dir = trusting(
        lambda ok: verify_run(run_dir, steps=steps, quiet=not verbose or as_json, yes=ok), yes
    )
    echo_err(f"twice: re-run recorded in {new_dir}")
    fault = read_manifest(run_dir).loss_fault
    echo_out(json_text(result.to_json()) if as_json else format_verify(result, use_color(), fault))
    sys.exit(result.exit_code)


@main.command(name="verify-resume", context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option(
    "--at",
    type=click.IntRange(min=1),
    default=None,
    help="Interrupt after this many steps  [default: half the run].",
)
@seed_option
@runs_dir_option
@determinism_option
@click.option(
    "--resume-command",
    default=None,
    metavar="'COMMAND'",
    help="Resume with this command instead (a script that resumes through its own flag, e.g. "
    "'python train.py --resume ckpt.pt'); where it starts is found by its parameters.",
)
@json_option
@quiet_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def verify_resume_command(at, seed, runs_dir, determinism, resume_command, as_json, quiet, command):
    """Check that an interrupted and resumed COMMAND equals the uninterrupted one, bit for bit.

    Runs COMMAND straight; again, stopped after --at steps (a real separate process); then resumed
    in a new process. Exit 0 when the resumed steps and the final state match, 1 otherwise, naming
    the first mismatch and the state that was missing.

    \b
    Examples:
      twice verify-resume -- python train.py
      twice verify-resume --at 100 -- python train.py --epochs 2
      twice verify-resume --resume-command 'python train.py --resume ckpt.pt' -- python train.py
    """
    import shlex

    from twice.app.launch import RunOptions
    from twice.app.options import root_seed
    from twice.app.verify import verify_resume

    options = RunOptions(
        seed=root_seed(seed), runs_dir=runs_dir, determinism=determinism, quiet=True
    )
    try:
        resume = shlex.split(resume_command) if resume_command is not None else None
    except ValueError as exc:
        raise UsageError(
            f"--resume-command is not a command line: {exc}", "quote it as a shell would"
        ) from None
    if resume is not None and not resume:
        raise UsageError("--resume-command is empty", "give the command that resumes the script")
    with reporting("verify-resume", quiet):
        check = verify_resume(list(command), options, at=at, resume_command=resume)
    echo_out(json_text(check.to_json()) if as_json else format_resume_check(check, use_color()))
    sys.exit(check.exit_code)
