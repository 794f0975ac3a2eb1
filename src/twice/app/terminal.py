"""What reaches the terminal: the one writer of every line, prompt, table and progress display
twice shows a person, each string made safe (control characters escaped, rich markup never read
from data), since records hold strings from anywhere.

tests/e2e/test_doors_output.py holds the rest of the package to it: no `print`, `click.echo`,
`click.style`, `click.confirm`, `sys.stdout`/`sys.stderr` or rich anywhere else.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import sys
from typing import Any

import click

from twice.core.escaping import escape_controls

__all__ = [
    "printable",
    "style",
    "use_color",
    "echo_out",
    "echo_err",
    "confirm",
    "is_terminal",
    "write_line",
    "table_text",
    "live_display",
]

# twice's own colour sequences carry this mark, made afresh in each process, until they are
# written: no record can know it, so a colour sequence found in data is escaped like any other
# control (one that hides text, `\x1b[8m`, included).
_MARK = "\ue000" + secrets.token_hex(8)
_SGR = re.compile(r"\x1b\[[0-9;]*m")
_MARKED = re.compile(re.escape(_MARK) + r"(\x1b\[[0-9;]*m)")


def printable(text: str, color: bool = False) -> str:
    """`text` safe for a terminal: every control character (an escape sequence's ESC, a carriage
    return, a bidirectional override) shown as its escape (`\\x1b`), except newlines and tabs;
    twice's own colours (made by `style`) kept where `color` is on, dropped otherwise. Records
    hold strings from anywhere (an argv, a tensor's name), and every line twice shows passes
    through here, so none reaches the terminal raw."""
    pieces = _MARKED.split(text)  # data at even indexes, twice's own sequences at odd ones
    return "".join(
        escape_controls(piece) if i % 2 == 0 else (piece if color else "")
        for i, piece in enumerate(pieces)
    )


def style(text: str, color: bool, **how: Any) -> str:
    """`text` in click.style's style `how` (`fg="red", bold=True`) where `color`, else as it is;
    the only colour sequences `printable` keeps are the ones made here."""
    if not color:
        return text
    return _SGR.sub(lambda m: _MARK + m.group(), click.style(escape_controls(text), **how))


def use_color() -> bool:
    """Style the output: on a terminal, unless NO_COLOR is set."""
    return not os.environ.get("NO_COLOR") and sys.stdout.isatty()


def echo_out(text: str = "") -> None:
    """Print `text` on stdout, its control characters escaped."""
    click.echo(printable(text, use_color()))


def echo_err(text: str) -> None:
    """Print `text` on stderr, its control characters escaped."""
    click.echo(printable(text, use_color() and sys.stderr.isatty()), err=True)


def confirm(question: str, default: bool = False) -> bool:
    """Ask `question` on stderr and read yes or no; the question is escaped as any line is."""
    return click.confirm(
        printable(question, use_color() and sys.stderr.isatty()), default=default, err=True
    )


def is_terminal(stream: Any = None) -> bool:
    """Whether `stream` (stderr when None) is a terminal."""
    return (stream if stream is not None else sys.stderr).isatty()


def write_line(stream: Any, text: str) -> None:
    """Write `text` as one line on `stream` (stderr when None), escaped, and flush it."""
    stream = stream if stream is not None else sys.stderr
    stream.write(printable(text) + "\n")
    stream.flush()


def _console(file: Any, **options: Any):
    """A rich console that reads no markup, emoji codes or highlighting from what it prints."""
    from rich.console import Console

    return Console(file=file, markup=False, emoji=False, highlight=False, **options)


def table_text(
    columns: dict[str, dict], rows: list[list[str]], notes: list[str] = (), width: int | None = None
) -> str:
    """A table (rich, no colour) with `columns` (header -> rich add_column options, or `rest`:
    one line, cut with an ellipsis to the width the other columns leave) and `rows`, then each of
    `notes` as a line; every cell is text, never markup, and escaped. `width`: the terminal's on
    a terminal, else 160."""
    from rich import box
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    if width is None:
        width = shutil.get_terminal_size((160, 24)).columns if sys.stdout.isatty() else 160
    buffer = io.StringIO()
    console = _console(buffer, width=width, color_system=None)
    if rows:
        rows = [[printable(cell) for cell in row] for row in rows]
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for index, (header, options) in enumerate(columns.items()):
            if options.get("rest"):  # a long one would squeeze every other column to nothing
                others = sum(
                    max([cell_len(h)] + [cell_len(row[i]) for row in rows]) + 2
                    for i, h in enumerate(columns)
                    if i != index
                )
                options = {"no_wrap": True, "overflow": "ellipsis", "max_width": width - others}
                options["max_width"] = max(10, options["max_width"] - (len(columns) - 1))
            table.add_column(header, **options)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
    for note in notes:
        console.print(Text(printable(note)))
    return buffer.getvalue().rstrip("\n")


def live_display(stream: Any = None):
    """A live progress display (rich) on `stream` (stderr when None): one bar per task, each
    description escaped and never read as markup; `say(text)` writes a line above it."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class Display(Progress):
        def add_task(self, description: str, *args: Any, **kwargs: Any):
            return super().add_task(printable(description), *args, **kwargs)

        def update(self, task_id: Any, *, description: str | None = None, **kwargs: Any):
            text = None if description is None else printable(description)
            return super().update(task_id, description=text, **kwargs)

        def say(self, text: str) -> None:
            self.console.print(Text(printable(text)))

    return Display(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console(stream if stream is not None else sys.stderr),
        transient=True,
    )
