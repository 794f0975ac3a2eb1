"""Commands for parametric studies: `sweep`, `stats`, `report`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from twice.app.render import (
    format_stats,
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
    verbose_option,
)


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
    help="local: processes on this machine; ray: Ray tasks (needs twice[ray], a shared "
    "filesystem).",
)
@click.option(
    "--ray-address", default=None, help="An existing Ray cluster (default: start a local one)."
)
@click.option(
    "--name",
    default=None,
    help="The sweep folder's name under --runs-dir  [default: from the settings].",
)
@runs_dir_option
@determinism_option
@json_option
@quiet_option
@verbose_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def sweep(
    vary,
    seeds,
    jobs,
    metric,
    executor,
    ray_address,
    name,
    runs_dir,
    determinism,
    as_json,
    quiet,
    verbose,
    command,
):
    """Run COMMAND for every combination of --vary values times --seeds seeds, each a recorded run.

    {name} in COMMAND is replaced by each value ({seed} too). Re-running the same sweep skips
    completed trials and retries failed ones; Ctrl-C leaves completed trials intact.

    \b
    Examples:
      twice sweep --vary lr=0.1,0.01 --seeds 5 -- python train.py --lr {lr}
      twice sweep --vary lr=0.1,0.01 --vary wd=0,1e-4 -j 2 -- python t.py --lr {lr} --wd {wd}
    """
    from twice.app.launch import RunOptions
    from twice.app.sweep import parse_vary, plan_trials, run_sweep
    from twice.store.sweeps import sweep_folder

    grid = parse_vary(list(vary))
    plan_trials(grid, seeds, list(command))  # validate before creating anything
    folder = sweep_folder(runs_dir, grid, name, seeds, list(command))
    with reporting("sweep", quiet) as reporter:
        # A bar of trials on a terminal; in a log a line only when a trial starts or ends.
        def progress(done, total, running, failed, eta):
            reporter.count(
                "trials", f"trials done ({running} running, {failed} failed)", done, total
            )

        outcome = run_sweep(
            folder,
            grid,
            seeds,
            list(command),
            jobs=jobs,
            metric=metric,
            options=RunOptions(runs_dir=runs_dir, determinism=determinism, quiet=not verbose),
            progress=progress,
            executor=executor,
            ray_address=ray_address,
        )
    if as_json:
        echo_out(json_text(outcome.to_json()))
        sys.exit(outcome.exit_code)
    echo_out(
        f"sweep {folder}: {outcome.completed} trials completed ({outcome.skipped} from before), "
        f"{len(outcome.failed)} failed"
        + (f", {outcome.elsewhere} run by another sweep" if outcome.elsewhere else "")
    )
    for failure in outcome.failed:
        echo_out(f"  failed: {failure}")
    if outcome.interrupted:
        echo_err("twice: interrupted; run the same command again to continue")
    sys.exit(outcome.exit_code)


@main.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--metric", default=None, help="The metric to compare  [default: the sweep's].")
@json_option
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
        echo_err(f"twice: report written to {html_out}")
    if as_json:
        arms_json, pairs_json = [a.to_json() for a in arms], [p.to_json() for p in pairs]
        echo_out(json_text({"metric": spec["metric"], "arms": arms_json, "pairs": pairs_json}))
    else:
        echo_out(format_stats(spec["metric"], arms, pairs))


@main.command()
@click.argument("paths", nargs=-1, required=True)
@runs_dir_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("report.html"),
    show_default=True,
    help="The HTML file to write (one offline page: no scripts, nothing fetched).",
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
    echo_out(f"report written to {write_report(resolved, output)}")
