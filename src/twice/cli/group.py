"""The `twice` command group: how commands print, and how every error becomes `error:`/`hint:`.

The printing helpers and shared options here are public within the package: every module of
`cli/` imports them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from twice.app.terminal import printable
from twice.core.errors import EXIT_USAGE, Exit, TwiceError, from_os_error

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def echo_out(text: str = "") -> None:
    """Print `text` on stdout, its control characters escaped (app/terminal.py)."""
    click.echo(printable(text, use_color()))


def echo_err(text: str) -> None:
    """Print `text` on stderr, its control characters escaped."""
    click.echo(printable(text, use_color() and sys.stderr.isatty()), err=True)


def json_text(value) -> str:
    """`value` as the JSON every `--json` prints: indented, keys sorted."""
    return json.dumps(value, indent=2, sort_keys=True)


def use_color() -> bool:
    """Style the output: on a terminal, unless NO_COLOR is set."""
    return not os.environ.get("NO_COLOR") and sys.stdout.isatty()


class TwiceGroup(click.Group):
    """Renders every error as `error:` / `hint:` on stderr with exit code 2, never a traceback."""

    def main(self, args=None, prog_name="twice", **kwargs):
        """Run the command line; every TwiceError and usage error becomes `error:`/`hint:` and its
        exit code."""
        debug = "--debug" in (args if args is not None else sys.argv[1:])
        try:
            return super().main(args=args, prog_name=prog_name, standalone_mode=False, **kwargs)
        except TwiceError as exc:
            if debug:
                raise
            echo_err(exc.render())
            sys.exit(exc.exit_code)
        except OSError as exc:  # a write or read the command could not do (full disk, a file in
            if debug:  # the way, a read-only folder): what and where, exit 2, no traceback
                raise
            echo_err(from_os_error(exc, "read or write a file").render())
            sys.exit(EXIT_USAGE)
        except click.exceptions.NoSuchOption as exc:
            hint = f"did you mean {' or '.join(exc.possibilities)}?" if exc.possibilities else None
            command = exc.ctx.command_path if exc.ctx else "twice"
            echo_err(
                f"error: unknown option {exc.option_name}\nhint: "
                f"{hint or f'see `{command} --help`'}"
            )
            sys.exit(EXIT_USAGE)
        except click.exceptions.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "twice"
            echo_err(f"error: {exc.format_message()}\nhint: see `{command} --help`")
            sys.exit(EXIT_USAGE)
        except click.exceptions.Abort:
            echo_err("error: aborted")
            sys.exit(Exit.INTERRUPTED)
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


def runs_dir_option(function):
    """The `--runs-dir` option (default: runs)."""
    return click.option(
        "--runs-dir",
        type=click.Path(path_type=Path),
        default=Path("runs"),
        show_default=True,
        help="Folder holding run folders.",
    )(function)


def yes_option(function):
    """The `--yes` option: re-run a run folder from elsewhere without asking (see trusting)."""
    return click.option(
        "--yes",
        "-y",
        is_flag=True,
        help="Re-run the command of a run folder recorded by another user or on another machine "
        "(without it: asked on a terminal, refused otherwise).",
    )(function)


def trusting(call, yes: bool):
    """`call(yes)`; a run folder from elsewhere is confirmed on a terminal (its command shown),
    refused with a hint otherwise."""
    from twice.app.trust import UntrustedRun

    try:
        return call(yes)
    except UntrustedRun as exc:
        if yes or not sys.stdin.isatty():
            raise
        echo_err(exc.message)
        if not click.confirm("run it?", default=False, err=True):
            raise
        return call(True)


# -- the flags every command spells the same way ---------------------------------------------------


def json_option(function):
    """The `--json` option (the parameter `as_json`)."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Machine-readable output on stdout."
    )(function)


def quiet_option(function):
    """The `-q/--quiet` option: no progress display."""
    return click.option(
        "--quiet", "-q", is_flag=True, help="Print the result only: no progress on stderr."
    )(function)


def verbose_option(function):
    """The `-v/--verbose` option."""
    return click.option(
        "--verbose",
        "-v",
        is_flag=True,
        help="Also echo the output of every process twice starts (always saved in its run folder).",
    )(function)


def determinism_option(function):
    """The `--determinism` option of the commands that run a command."""
    return click.option(
        "--determinism",
        type=click.Choice(["strict", "warn", "off"]),
        default="strict",
        show_default=True,
        help="strict: deterministic algorithms, an error for an op that has none; warn: run such "
        "an op and list it (a warning, and in the manifest); off: seed only.",
    )(function)


def reporting(command: str, quiet: bool):
    """The progress display of `command` on stderr (app/progress.py), silenced by -q."""
    from twice.app.progress import Reporter

    return Reporter(command, quiet=quiet)
