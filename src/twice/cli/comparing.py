"""Commands that judge runs: `diff`, `locate`, `bisect`, `nan`, and `audit` (which runs a
command's first steps twice to see which operations differ)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from twice.app.render import (
    format_audit,
    format_bisect,
    format_comparison,
    format_locate,
    format_nan,
)
from twice.cli.group import (
    CONTEXT,
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
from twice.core.errors import Exit, UsageError


@main.command()
@click.argument("a")
@click.argument("b")
@runs_dir_option
@click.option(
    "--steps", type=click.IntRange(min=1), default=None, help="Compare only the first N steps."
)
@click.option(
    "--offset",
    type=click.IntRange(min=-(2**63 - 1), max=2**63 - 1),
    default=None,
    help="B's step 0 is A's step N (negative: A's step 0 is B's step -N)  [default: by step "
    "number, or where B's starting parameters occur in A when B resumed itself].",
)
@json_option
@click.option(
    "--html",
    "html_out",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the HTML report here.",
)
def diff(a, b, runs_dir, steps, offset, as_json, html_out):
    """Compare two runs: the verdict, identity differences, the first divergence and its cause.

    Exit 0 when identical, 1 when different, 2 when no step was recorded to judge by.

    \b
    Examples:
      twice diff runs/<a> runs/<b>
      twice diff <id-a> <id-b> --json
      twice diff straight resumed --offset 50   # resumed's step 0 is straight's step 50
    """
    from twice.app.compare import compare_runs
    from twice.store.files import check_output_path
    from twice.store.runs import find_run

    if html_out is not None:  # refused before the verdict: a verdict's exit code is its own
        check_output_path(html_out, "report")
    result = compare_runs(find_run(a, runs_dir), find_run(b, runs_dir), steps=steps, offset=offset)
    if html_out is not None:
        from twice.app.report import write_report

        write_report([result.a, result.b], html_out)
        echo_err(f"twice: report written to {html_out}")
    echo_out(json_text(result.to_json()) if as_json else format_comparison(result, use_color()))
    sys.exit(result.exit_code)


@main.command()
@click.argument("a")
@click.argument("b")
@runs_dir_option
@json_option
@quiet_option
@verbose_option
@yes_option
def locate(a, b, runs_dir, as_json, quiet, verbose, yes):
    """The first operation whose inputs were identical and whose outputs differed in runs A and B.

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
    with reporting("locate", quiet):
        result = trusting(lambda ok: locate_runs(run_a, run_b, quiet=not verbose, yes=ok), yes)
    echo_out(json_text(result.to_json()) if as_json else format_locate(result))
    sys.exit(result.exit_code)


@main.command()
@click.argument("run_ref", metavar="RUN")
@runs_dir_option
@json_option
def nan(run_ref, runs_dir, as_json):
    """Show RUN's numerical health: where its first NaN/Inf came from and the warnings before it.

    Exit 0 when the run recorded no fault, 1 when it did.

    \b
    Examples:
      twice nan runs/<id>
      twice nan <id> --json
    """
    from twice.store.faults import read_numerics
    from twice.store.runs import find_run, read_manifest

    run_dir = find_run(run_ref, runs_dir)
    manifest = read_manifest(run_dir)  # a damaged run folder is an error, not "no NaN recorded"
    report, events = read_numerics(run_dir)
    faulty = report is not None or any(e["kind"] == "non_finite" for e in events)
    loss = manifest.loss_fault
    if as_json:
        echo_out(json_text({"report": report, "events": events, "loss_fault": loss}))
    elif not faulty and loss is not None:  # seen in the trace's losses, not by a health check
        from twice.store.traceseries import loss_fault_phrase

        echo_out(
            f"{loss_fault_phrase(loss)} (from the trace)\n"
            "(run with `twice run --numerics` to find the operation and line)"
        )
    else:
        echo_out(format_nan(report, events, use_color()))
    sys.exit(Exit.DIFFER if faulty or loss is not None else Exit.SAME)


@main.command()
@click.argument("a")
@click.argument("b")
@runs_dir_option
@json_option
@quiet_option
@verbose_option
@yes_option
def bisect(a, b, runs_dir, as_json, quiet, verbose, yes):
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

    run_a, run_b = find_run(a, runs_dir), find_run(b, runs_dir)
    with reporting("bisect", quiet):
        result = trusting(
            lambda ok: bisect_divergence(run_a, run_b, quiet=not verbose, yes=ok), yes
        )
    echo_out(json_text(result.to_json()) if as_json else format_bisect(result))
    sys.exit(Exit.SAME if result.step is None else Exit.DIFFER)


@main.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="How many steps to record twice.",
)
@seed_option
@runs_dir_option
@click.option(
    "--determinism",
    type=click.Choice(["strict", "warn", "off"]),
    default="warn",
    show_default=True,
    help="warn (default) lets nondeterministic kernels run so that they can be seen.",
)
@click.option(
    "--for",
    "target",
    type=click.Choice(["here", "cuda"]),
    default="here",
    show_default=True,
    help="here: exit 1 only for ops that gave different bits in this audit; cuda: also for ops "
    "this model runs that are nondeterministic on CUDA.",
)
@click.option(
    "--portable",
    is_flag=True,
    help="List instead every op the command runs that portable mode (twice run --portable) "
    "does not cover; exit 1 if there is one.",
)
@click.option(
    "--coverage",
    is_flag=True,
    help="With --portable and no command: how portable mode covers each op of PyTorch's Core "
    "ATen opset (kernel, exact, decomposed or uncovered); exit 1 if one is uncovered.",
)
@json_option
@quiet_option
@verbose_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def audit(
    steps, seed, runs_dir, determinism, target, portable, coverage, as_json, quiet, verbose, command
):
    """List the nondeterminism COMMAND really hits: ops that gave different bits from identical
    inputs in two runs of its first steps, and every call site of an op it runs that is
    nondeterministic on CUDA. Exit 1 for what was observed (with --for cuda, also for what would
    be on a GPU).

    \b
    Examples:
      twice audit -- python train.py
      twice audit --steps 3 -- python train.py --lr 0.1
      twice audit --for cuda -- python train.py
      twice audit --portable -- python train.py
      twice audit --portable --coverage
    """
    from twice.app.audit import audit_command
    from twice.app.launch import RunOptions
    from twice.app.options import root_seed

    if coverage:
        if not portable or command:
            raise UsageError(
                "--coverage lists portable mode's coverage of the core opset, for no command",
                hint="run `twice audit --portable --coverage` alone",
            )
        from twice.app.portability import core_coverage, format_core_coverage

        found = core_coverage()
        echo_out(json_text(found) if as_json else format_core_coverage(found))
        sys.exit(Exit.DIFFER if found["counts"].get("uncovered") else Exit.SAME)
    if portable:
        from twice.app.portability import format_portable_audit, portable_audit

        with reporting("audit", quiet):
            found = portable_audit(
                list(command),
                RunOptions(
                    seed=root_seed(seed), runs_dir=runs_dir, determinism="warn", quiet=not verbose
                ),
                steps,
            )
        echo_out(json_text(found.to_json()) if as_json else format_portable_audit(found))
        sys.exit(found.status)

    with reporting("audit", quiet):
        report = audit_command(
            list(command),
            RunOptions(
                seed=root_seed(seed),
                runs_dir=runs_dir,
                determinism=determinism,
                quiet=not verbose,
            ),
            steps=steps,
            target=target,
        )
    echo_out(json_text(report.to_json()) if as_json else format_audit(report, steps))
    sys.exit(report.exit_code)
