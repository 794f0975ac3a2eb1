"""What a person sees: one writer (app/terminal.py) for every line, prompt, table and progress
display; hostile strings in real run folders reach no terminal raw, no page as markup, no plot as
mathtext; an internal error is exit 3 with its traceback saved, never a verdict's 1."""

from __future__ import annotations

import ast
import io
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import clean_env, runs, script, twice
from house.test_architecture import MODULES

from twice.core.errors import Exit

# -- the writer is the only door ------------------------------------------------------------------

WRITER = "twice.app.terminal"
# Code that runs inside the user's training process writes to that process's stderr itself (the
# command line's writer is not there); each such write passes its text through escape_controls.
IN_PROCESS = {
    "twice.runtime.bootstrap": "a determinism error that stops the user's process as it boots",
    "twice.record.numerics": "the one line of `--numerics stop` before the process exits",
    "twice.record.replicas": "a replica check that failed as a distributed run ended",
    "twice.integrations.lightning": "the run folder's path, as a Lightning run ends",
    "twice.integrations.mlflow": "a warning of the MLflow export, during training",
}
# The command's own output, passed on unchanged: `twice run` shows what the command writes, as
# the command alone would have.
PASS_THROUGH = {"twice.app.launch": "the command's stdout and stderr, copied to the terminal"}
ESCAPERS = {"escape_controls", "printable"}
CLICK_OUTPUT = {"echo", "secho", "confirm", "prompt", "style", "pause", "edit", "progressbar"}
STREAMS = {"stdout", "stderr", "__stdout__", "__stderr__"}


def _escaped(call: ast.AST) -> bool:
    """Whether `call`'s first argument is the text passed through an escaping function."""
    if not isinstance(call, ast.Call) or not call.args:
        return False
    arg = call.args[0]
    name = getattr(
        getattr(arg, "func", None), "id", getattr(getattr(arg, "func", None), "attr", "")
    )
    return isinstance(arg, ast.Call) and name in ESCAPERS


def output_calls(source: str) -> list[tuple[int, str, bool]]:
    """(line, what, escaped) for each way `source` could write to the terminal by itself: print,
    click's output functions, rich, sys.stdout/sys.stderr, `.print(` on any console, os.write
    to fd 1 or 2. `escaped`: a `sys.stderr.write(escape_controls(...))` or a `.flush()`."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "print":
                found.append((line, "print(", False))
            elif isinstance(func, ast.Attribute):
                owner = getattr(func.value, "id", None)
                if owner == "click" and func.attr in CLICK_OUTPUT:
                    found.append((line, f"click.{func.attr}(", False))
                elif func.attr in ("print", "print_exc", "print_exception", "print_stack"):
                    found.append((line, f".{func.attr}(", False))
                elif (
                    owner == "os"
                    and func.attr == "write"
                    and node.args
                    and getattr(node.args[0], "value", None) in (1, 2)
                ):
                    found.append((line, "os.write(1|2", False))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            module = getattr(node, "module", None) or ""
            if any(n == "rich" or n.startswith("rich.") for n in names + [module]):
                found.append((line, "import rich", False))
            if module == "click" and {a.name for a in node.names} & CLICK_OUTPUT:
                found.append((line, "from click import <output>", False))
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in STREAMS
            and getattr(node.value, "id", None) == "sys"
        ):
            use = parents.get(node)
            call = parents.get(use)
            ok = isinstance(use, ast.Attribute) and (
                (use.attr == "write" and _escaped(call)) or use.attr == "flush"
            )
            found.append((line, f"sys.{node.attr}", ok))
    return found


def test_only_the_writer_writes_to_the_terminal():
    """docs/ARCHITECTURE.md, Doors: print, click.echo/confirm/style, rich and sys.stdout/stderr
    only in app/terminal.py; the user's process writes escaped lines; launch passes the command's
    own output through."""
    wrong, used = [], set()
    for module, path in MODULES.items():
        if module == WRITER or module.startswith("twice.runtime._boot"):
            continue  # _boot: sitecustomize, before twice can be imported (fixed strings)
        for line, what, escaped in output_calls(path.read_text()):
            if module in PASS_THROUGH and what.startswith("sys."):
                used.add(module)
            elif module in IN_PROCESS and escaped:
                used.add(module)
            else:
                wrong.append(f"{module}:{line} {what}")
    assert wrong == [], f"print through twice.app.terminal (echo_out, echo_err, ...): {wrong}"
    assert used == set(IN_PROCESS) | set(PASS_THROUGH), "drop the entries no longer needed"


@pytest.mark.parametrize(
    "source",
    [
        "print('x')",
        "click.echo(x)",
        "click.confirm(question)",
        "click.style(text, fg='red')",
        "from rich.console import Console",
        "import rich",
        "console.print(row)",
        "sys.stdout.write(text)",
        "sys.stderr.buffer.write(data)",
        "f(file=sys.stderr)",
        "os.write(2, data)",
        "traceback.print_exc()",
    ],
)
def test_the_output_scan_sees_a_planted_write(source):
    assert [escaped for _, _, escaped in output_calls(source)] == [False], source


def test_an_escaped_write_in_the_users_process_is_allowed():
    source = "sys.stderr.write(escape_controls(text))\nsys.stderr.flush()\n"
    assert [escaped for _, _, escaped in output_calls(source)] == [True, True]
    assert [e for _, _, e in output_calls("sys.stderr.write(text)")] == [False]


# -- hostile strings in real run folders ----------------------------------------------------------

ESCAPES = ["\x1b[2J", "\x1b]52;c;ZXZpbA==\x07", "\x1b[8m", "\u202e"]
MARKUP = ["[blink]x[/blink]", "[link=http://e]x[/link]"]
SCRIPT = "<script>alert(1)</script>"
MATH = "m$\\undefinedcmd$"
HOSTILE = "".join(ESCAPES + MARKUP + [SCRIPT, MATH])
FOLDER = HOSTILE.replace("/", "|")  # a folder's name holds no slash
RAW = ["\x1b", "\x07", "\x9b", "\x85", "\u202e", "\u2066"]  # ESC, BEL, C1 CSI and NEL, bidi


def _clean(text: str, what) -> None:
    assert not [c for c in RAW if c in text], (what, text[-2000:])
    assert "Traceback" not in text, (what, text[-2000:])


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A real run (`base`), a copy of it under a hostile folder name with hostile metric names
    and numerics records (`named`, still signed), and a copy with a hostile argv (`foreign`: its
    signature no longer holds)."""
    tmp = tmp_path_factory.mktemp("doors")
    script("tiny_train.py", tmp)
    result = twice("run", "--name", "base", "--", sys.executable, "tiny_train.py", "w.pt", cwd=tmp)
    assert result.returncode == 0, result.stderr
    base = runs(tmp)[0]
    named = tmp / "runs" / FOLDER
    shutil.copytree(base, named)
    (named / "metrics.jsonl").write_text(
        json.dumps({"name": HOSTILE, "value": 1.5, "step": 0, "time": 1.0})
        + "\n"
        + json.dumps({"name": HOSTILE, "value": 0.5, "step": 1, "time": 2.0})
        + "\n"
    )
    event = {"kind": "non_finite", "step": 0, "summary": HOSTILE, "module": HOSTILE}
    (named / "numerics.jsonl").write_text(json.dumps(event) + "\n")
    fault = {"value": "nan", "op": HOSTILE, "step": 0, "phase": "forward", "line": HOSTILE}
    chain = [{**event, "line": HOSTILE, "fix": HOSTILE}]
    (named / "numerics.json").write_text(json.dumps({"fault": fault, "chain": chain}))
    foreign = tmp / "runs" / (base.name[:26] + "-foreign")
    shutil.copytree(base, foreign)
    manifest = json.loads((foreign / "manifest.json").read_text())
    manifest["identity"]["argv"] += [*ESCAPES, *MARKUP, SCRIPT, MATH, HOSTILE]
    (foreign / "manifest.json").write_text(json.dumps(manifest))
    return tmp, base, named, foreign


@pytest.mark.parametrize(
    "command",
    [
        ("ls",),
        ("ls", "--json"),
        ("show", "{named}"),
        ("show", "{foreign}"),
        ("show", "{named}", "--json"),
        ("diff", "{base}", "{named}"),
        ("diff", "{base}", "{foreign}"),
        ("nan", "{named}"),
        ("verify", "{foreign}"),  # refused: its command is shown in the error
    ],
)
def test_hostile_records_reach_the_terminal_escaped(hostile, command):
    tmp, base, named, foreign = hostile
    args = [a.format(base=base, named=named, foreign=foreign) for a in command]
    result = twice(*args, cwd=tmp)
    assert result.returncode in (0, 1, 2), (args, result.stderr)
    _clean(result.stdout + result.stderr, args)
    if command[0] == "ls" and "--json" not in command:
        assert "[blink]x[|blink]" in result.stdout  # the folder's name, as text
    if command == ("show", "{foreign}"):
        assert "[blink]x[/blink]" in result.stdout and "[link=http://e]x[/link]" in result.stdout
    if command[:2] == ("verify", "{foreign}"):
        assert result.returncode == 2 and "it would run:" in result.stderr
        assert "\\x1b[8m" in result.stderr and "[link=http://e]x[/link]" in result.stderr


def test_verify_of_a_hostile_folder_shows_its_progress_escaped(hostile):
    tmp, base, named, foreign = hostile
    result = twice("verify", named, cwd=tmp)
    assert result.returncode in (0, 1), result.stderr
    _clean(result.stdout + result.stderr, "verify")
    progress = [line for line in result.stderr.splitlines() if line.startswith("twice verify:")]
    assert progress and all("\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07" in line for line in progress)


def test_the_report_of_hostile_runs_is_inert_html_and_plots(hostile):
    tmp, base, named, foreign = hostile
    page = tmp / "report.html"
    result = twice("report", base, named, foreign, "-o", page, cwd=tmp)
    assert result.returncode == 0, result.stderr
    _clean(result.stdout + result.stderr, "report")
    text = page.read_text()
    assert (
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">" in text
    )
    assert "<script" not in text.lower() and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not [c for c in RAW if c in text]
    plots = [chunk.split("</svg>")[0] for chunk in text.split("<svg")[1:]]
    assert any(MATH in plot for plot in plots)  # the metric's name, drawn as plain text


def test_the_trust_prompt_shows_a_hostile_command_escaped(hostile):
    """On a terminal, `verify` asks before running a foreign command: the command is shown
    escaped (an SGR that hides text cannot hide the rest of it), and no answers no."""
    tmp, base, named, foreign = hostile
    master, slave = pty.openpty()
    env = clean_env()
    env.pop("NO_COLOR", None)  # colours on: twice's own may be written, the data's never
    process = subprocess.Popen(
        [sys.executable, "-m", "twice", "verify", str(foreign)],
        cwd=tmp,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    out, answered, deadline = b"", False, time.monotonic() + 120
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if not answered and b"run it?" in out:
                os.write(master, b"n\n")
                answered = True
        elif process.poll() is not None and answered:
            break
    os.close(master)
    assert process.wait(timeout=30) == Exit.USAGE
    text = out.decode("utf-8", "replace")
    assert answered and "it would run:" in text and "\\x1b[8m" in text
    # On a terminal twice draws too: rich's cursor moves, and its own colours (bold, a colour,
    # reset), never an SGR that hides text, nor the data's sequences.
    own = re.compile(r"\x1b\[(\?25[lh]|[0-9]*[AK]|(0|1|3[0-7]|39|22)(;[0-9]+)*m)")
    _clean(own.sub("", text), "trust prompt")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_live_display_reads_no_markup_and_no_controls_from_names(tmp_path):
    """On a terminal the progress is drawn by rich: a run's label is text, never markup."""
    from twice.app.progress import Reporter

    run = tmp_path / "r"
    run.mkdir()
    terminal = _Terminal()
    with Reporter("verify", stream=terminal) as reporter:
        reporter.started(run, MARKUP[1], 2)  # a bar's description, then a line when it ends
        reporter.count("n", MARKUP[0], 1, 2)
        reporter.event(HOSTILE)
        reporter.ended(run, 0)
    text = terminal.getvalue()
    for raw in ESCAPES:
        assert raw not in text
    assert "[blink]x[/blink]" in text and "[link=http://e]x[/link]" in text
    assert "\x1b]8;" not in text and "\x1b[5m" not in text  # no hyperlink, no blink drawn


def test_colour_is_twice_own_never_the_datas():
    from twice.app.terminal import printable, style

    painted = style("ok", True, fg="green") + " \x1b[8mhidden" + style(HOSTILE, True, bold=True)
    shown = printable(painted, color=True)
    assert shown.count("\x1b[") == 4  # two styles, each opened and reset; none from the data
    assert "\\x1b[8mhidden" in shown and "\\x1b[2J" in shown
    assert printable(painted) == "ok \\x1b[8mhidden" + printable(HOSTILE)


# -- exit codes -----------------------------------------------------------------------------------


def _planted_bug(*args, **kwargs):
    raise RuntimeError("planted bug\nsecond line")


@pytest.mark.parametrize("cache", ["folder", "a file in the way"])
def test_an_internal_error_is_exit_3_with_its_traceback_saved(tmp_path, monkeypatch, cache):
    import twice.app.listing
    from twice.cli import main

    (tmp_path / "runs").mkdir()
    cache_dir = tmp_path / "cache"
    if cache != "folder":
        cache_dir.write_text("")  # the cache folder cannot be made: a temporary file instead
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_dir))
    monkeypatch.setattr(twice.app.listing, "summarize_sweeps", _planted_bug)
    result = CliRunner().invoke(main, ["ls", str(tmp_path / "runs")])
    assert result.exit_code == Exit.INTERNAL == 3
    error, hint = result.stderr.splitlines()
    assert error == "error: internal error: RuntimeError: planted bug"
    assert hint.startswith("hint: the traceback was saved to ") and hint.endswith(
        "; please report it"
    )
    saved = Path(hint[len("hint: the traceback was saved to ") : -len("; please report it")])
    assert (saved.parent == cache_dir / "twice") == (cache == "folder")
    text = saved.read_text()
    assert "Traceback" in text and "RuntimeError: planted bug" in text and "_planted_bug" in text
    if cache != "folder":
        saved.unlink()
    debug = CliRunner().invoke(main, ["--debug", "ls", str(tmp_path / "runs")])
    assert isinstance(debug.exception, RuntimeError)  # --debug: the traceback itself


def test_python_dash_m_twice_gives_exit_3_for_an_internal_error(tmp_path):
    (tmp_path / "runs").mkdir()
    code = (
        "import runpy, sys\nimport twice.app.listing as listing\n"
        "def bug(*a):\n    raise KeyError('planted')\n"
        "listing.summarize_sweeps = bug\nsys.argv = ['twice', 'ls', 'runs']\n"
        "runpy.run_module('twice', run_name='__main__')\n"
    )
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error: internal error: KeyError: 'planted'\nhint: ")
    assert len(list((tmp_path / "cache" / "twice").glob("crash-*.txt"))) == 1


def _unescaped_warnings(source: str) -> list[int]:
    """Lines of `warnings.warn` / `warn_explicit` calls whose message is not escape_controls(...):
    a warning reaches the user's terminal through Python's warnings, around the writer."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("warn", "warn_explicit")
            and getattr(node.func.value, "id", None) == "warnings"
        ):
            message = node.args[0] if node.args else None
            if not (
                isinstance(message, ast.Call)
                and getattr(message.func, "id", None) == "escape_controls"
            ):
                lines.append(node.lineno)
    return lines


def test_every_warning_twice_gives_is_escaped():
    wrong = [
        f"{module}:{line}"
        for module, path in MODULES.items()
        for line in _unescaped_warnings(path.read_text())
    ]
    assert wrong == [], f"warn with escape_controls(message) (twice.core.escaping): {wrong}"
    assert _unescaped_warnings("import warnings\nwarnings.warn(f'{name}')\n") == [2]
