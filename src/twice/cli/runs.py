"""Commands about runs and this machine: `ls`, `show`, `env`, `checkpoint`, `export`."""

from __future__ import annotations

from pathlib import Path

import click

from twice.app.render import (
    format_checkpoint,
    format_env,
    format_run,
)
from twice.cli.group import echo_out, json_option, json_text, main, runs_dir_option, use_color
from twice.core.errors import CorruptRecord, TwiceError, UsageError
from twice.store.layout import RunFolder


@main.command()
@json_option
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
        echo_out(json_text({"hazards": [h.to_json() for h in hazards], "facts": facts}))
    else:
        echo_out(format_env(hazards, facts, use_color()))


@main.command(name="ls")
@click.argument("folder", required=False, type=click.Path(path_type=Path), default=None)
@runs_dir_option
@json_option
def list_command(folder, runs_dir, as_json):
    """List the runs in the runs folder (--runs-dir, or FOLDER), oldest first, then its sweeps.

    Runs that twice's own commands started (verify, locate, bisect re-runs) are marked.

    \b
    Examples:
      twice ls
      twice ls --runs-dir experiments/runs --json
    """
    from twice.app.listing import format_run_table, summarize_sweeps
    from twice.store.runs import summarize_runs

    runs_dir = folder if folder is not None else runs_dir
    if not runs_dir.is_dir():
        raise UsageError(
            f"no runs folder {runs_dir}",
            "start a run with `twice run`, or pass the folder that holds runs (--runs-dir)",
        )
    rows = summarize_runs(runs_dir)
    sweeps = summarize_sweeps(runs_dir)
    if as_json:
        echo_out(json_text({"runs": rows, "sweeps": sweeps}))
    elif rows or sweeps:
        echo_out(format_run_table(rows, sweeps))
    damaged = [row["id"] for row in rows if row.get("error")]
    damaged += [f"sweep {row['sweep']}" for row in sweeps if row.get("error")]
    if damaged:  # listed with the rest, then refused: a damaged record is never a quiet row
        raise CorruptRecord(
            f"{len(damaged)} run folder(s) could not be read: {', '.join(damaged[:5])}",
            "see `twice show <run>` for what is wrong with each; remove or re-record them",
        )


@main.command()
@click.argument("run_ref", metavar="RUN")
@runs_dir_option
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
    from twice.store.runs import effective_status, find_run, read_manifest, summarize_run

    run_dir = find_run(run_ref, runs_dir)
    manifest = read_manifest(run_dir)
    if as_json:
        data = manifest.to_json()
        data["context"] = {**manifest.context, "effective_status": effective_status(manifest)}
        echo_out(json_text(data))
        return
    echo_out(format_run(summarize_run(run_dir), manifest.identity))


@main.group(name="export")
def export_group():
    """Put recorded runs into other tools (MLflow)."""


@export_group.command(name="mlflow")
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True)
@runs_dir_option
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
@json_option
def export_mlflow(run_refs, runs_dir, tracking_uri, experiment, no_checkpoints, as_json):
    """Export each RUN to MLflow: hyperparameters and identity as params, the trace as metrics,
    the run folder as artifacts. A run exported before is not exported twice.

    \b
    Examples:
      twice export mlflow runs/<id> --tracking-uri sqlite:///mlflow.db
      twice export mlflow runs/* --experiment lr-study
    """
    from twice.integrations.mlflow import export_run
    from twice.store.runs import find_run

    exported = []
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
        exported.append({"run": str(run_dir), "mlflow_run_id": run_id, "created": created})
        if not as_json:
            echo_out(
                f"{run_dir.name} -> mlflow run {run_id}" + ("" if created else " (exported before)")
            )
    if as_json:
        echo_out(json_text(exported))


@main.group(name="checkpoint")
def checkpoint_group():
    """Inspect checkpoints written by twice.Run.checkpoint() or twice.checkpoint.save()."""


@checkpoint_group.command(name="verify")
@click.argument("path", type=click.Path(path_type=Path))
@json_option
def checkpoint_verify(path, as_json):
    """Check every file of the checkpoint at PATH against its recorded digest (exit 0 valid, 2 not).

    \b
    Examples:
      twice checkpoint verify runs/<id>/checkpoints/step-00000400
    """
    from twice.checkpoint import verify as verify_checkpoint

    index = verify_checkpoint(path)
    if as_json:
        held = (
            {"rank_parts": index.world_size}
            if hasattr(index, "parts")
            else {"entries": sorted(index.entries)}
        )
        echo_out(json_text({"path": str(path), "valid": True, **held}))
    else:
        echo_out(format_checkpoint(path, index))


@checkpoint_group.command(name="ls")
@click.argument("run_ref", metavar="RUN")
@runs_dir_option
@json_option
def checkpoint_ls(run_ref, runs_dir, as_json):
    """List RUN's checkpoints, newest last, each valid or why not.

    \b
    Examples:
      twice checkpoint ls runs/<id>
    """
    from twice.checkpoint import CheckpointError, list_checkpoints
    from twice.checkpoint import verify as verify_checkpoint
    from twice.store.runs import find_run

    run_dir = find_run(run_ref, runs_dir)
    rows = []
    for path in list_checkpoints(RunFolder(run_dir).checkpoints):
        try:
            verify_checkpoint(path)
            rows.append({"name": path.name, "path": str(path), "valid": True, "problem": None})
        except CheckpointError as exc:
            rows.append(
                {"name": path.name, "path": str(path), "valid": False, "problem": exc.message}
            )
    if as_json:
        echo_out(json_text(rows))
        return
    for row in rows:
        echo_out(
            f"{row['name']}  valid" if row["valid"] else f"{row['name']}  INVALID: {row['problem']}"
        )
