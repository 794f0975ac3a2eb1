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

# What every command prints goes through the one writer, app/terminal.py; the modules of cli/
# import its functions from here.
from twice.app.terminal import confirm as confirm
from twice.app.terminal import echo_err as echo_err
from twice.app.terminal import echo_out as echo_out
from twice.app.terminal import use_color as use_color
from twice.core.errors import EXIT_USAGE, Exit, TwiceError, from_os_error

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def json_text(value) -> str:
    """`value` as the JSON every `--json` prints: indented, keys sorted."""
    return json.dumps(value, indent=2, sort_keys=True)


class TwiceGroup(click.Group):
    """Renders every error as `error:` / `hint:` on stderr, never a traceback: a TwiceError or
    usage error with its exit code (2), any other exception as an internal error (3, its
    traceback saved to a file)."""

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
        except Exception as exc:  # a bug of twice's: exit 3, never 1, which is a verdict
            if debug:
                raise
            saved = _save_traceback(exc)
            try:
                summary = (str(exc).strip().splitlines() or [""])[0][:200]
            except Exception:  # an exception whose message itself fails
                summary = "(no message)"
            echo_err(
                f"error: internal error: {type(exc).__name__}: {summary}\nhint: "
                + (
                    f"the traceback was saved to {saved}; please report it"
                    if saved is not None
                    else "run it again with --debug to see the traceback; please report it"
                )
            )
            sys.exit(Exit.INTERNAL)


def _save_traceback(exc: BaseException) -> Path | None:
    """Write `exc`'s traceback for a bug report: under the user's cache folder, else to a
    temporary file; None where neither can be written (saving never crashes in turn)."""
    import tempfile
    import time
    import traceback

    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    try:
        text = f"twice {' '.join(sys.argv[1:])}\n" + "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        )
    except Exception:  # a traceback that cannot be formatted: the exception's type at least
        text = f"{type(exc).__name__} (its traceback could not be formatted)\n"
    try:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "twice"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / name, "x", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
        return folder / name
    except Exception:  # no cache folder to write in (read-only home, a file in the way)
        pass
    try:
        fd, path = tempfile.mkstemp(prefix="twice-crash-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
        return Path(path)
    except Exception:  # nowhere to write: the hint says how to see the traceback instead
        return None


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
    """`call(consent)`: True with --yes; else a question the trust check asks about a run folder
    from elsewhere, on a terminal (its command shown; elsewhere refused with a hint). The library
    runs the very manifest it showed (app/trust.py): `call` is made once, nothing read again."""
    if yes:
        return call(True)

    def ask(message: str) -> bool:
        if not sys.stdin.isatty():
            return False
        echo_err(message)
        return confirm("run it?", default=False)

    return call(ask)


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


def seed_option(function):
    """The `--seed` option, one for every command that takes one. Its default is None, "not
    given", which each command resolves to its own documented meaning (docs/commands.md): the root
    seed `app.options.DEFAULT_SEED` of the runs it starts, or, for `verify --segments`, a fresh
    seed of the segments' draw."""
    return click.option(
        "--seed",
        type=int,
        default=None,
        help="Root seed for every RNG of the command run  [default: 0]. (verify re-runs with the "
        "recorded seed; with --segments, --seed seeds the draw of segments  [default: a fresh "
        "one, printed and recorded].)",
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
