"""The hostile-form matrix: every file kind of docs/ARCHITECTURE.md's read inventory, in every
hostile form, through every command that reads it, in a real `twice` process under a memory
limit and a timeout.

A form that damages a record must give `error:` and exit 2; a record that stays valid gives the
true verdict (0 or 1). Whatever the form: no traceback, never exit 3, no raw escape sequence in
what is printed, no script in a report, no marker file (no code ran). `make test` draws a seeded
sample of the cases; `make test-slow` (TWICE_EXHAUSTIVE=1) runs them all.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import SCRIPTS, clean_env, twice

from twice.store.layout import RunFolder

ARCHITECTURE = Path(__file__).parents[2] / "docs" / "ARCHITECTURE.md"
EXHAUSTIVE = os.environ.get("TWICE_EXHAUSTIVE") == "1"
SAMPLE = 36  # cases drawn in `make test`

HOSTILE_TEXT = (
    "\x1b[2J\x1b]52;c;ZXZpbA==\x07\x9b31m\u202eevil\u2066<script>alert(1)</script>"
    "[blink]x[/blink][link=http://e]y[/link]m$\\undefinedcmd$`touch MARKER`$(touch MARKER)"
)
MATRIX_COMMANDS = {
    "show",
    "ls",
    "diff",
    "report",
    "nan",
}  # the commands that read without re-running
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# ---- the file kinds, with a valid sample and what reads them ----


@dataclass
class Kind:
    """One file kind of the inventory, as the matrix plants and reads it."""

    name: str
    path: object  # RunFolder -> Path
    commands: tuple[str, ...]
    sample: object = None  # a valid value to plant; None: as the run recorded it
    lines: bool = False  # a line-per-record file
    checked: tuple[str, ...] = ()  # top-level fields its reader checks (a wrong type is damage)
    missing: dict = field(default_factory=dict)  # command -> exits when the file is absent
    config: bool = False  # read only for a run with a config: give both runs one


KINDS = [
    Kind(
        "manifest",
        lambda f: f.manifest,
        ("show", "ls", "diff", "report", "nan"),
        checked=("identity", "context"),
        missing={"show": {2}, "ls": {0}, "diff": {2}, "report": {2}, "nan": {2}},
    ),
    Kind(
        "trace",
        lambda f: f.trace(),
        ("show", "ls", "diff", "report"),
        lines=True,
        checked=("step", "loss", "batch", "grads", "params"),
        missing={"show": {0}, "ls": {0}, "diff": {2}, "report": {2}},
    ),
    Kind(
        "config defaults",
        lambda f: f.config_defaults,
        ("show", "ls", "diff"),
        {"lr": 0.05},
        config=True,
    ),
    Kind(
        "capture error",
        lambda f: f.capture_error,
        ("diff",),
        {"step": 3, "handler": "step", "error": "RuntimeError: x", "traceback": "t"},
        checked=("step", "error"),
    ),
    Kind(
        "numerics report",
        lambda f: f.numerics_report,
        ("nan", "report", "diff"),
        {
            "fault": {"value": "nan", "step": 3, "op": "aten::div", "phase": "forward"},
            "chain": [{"step": 3, "summary": "zeros", "line": "train.py:9"}],
        },
        checked=("fault", "chain"),
    ),
    Kind(
        "numerics events",
        lambda f: f.numerics_events,
        ("nan", "diff"),
        {"kind": "saturation", "step": 2, "summary": "softmax saturated"},
        lines=True,
        checked=("kind", "step", "summary"),
    ),
    Kind(
        "metrics log",
        lambda f: f.metrics,
        ("report",),
        {"name": "acc", "value": 0.5, "step": 1, "time": 1.0},
        lines=True,
        checked=("name", "value"),
    ),
    Kind(
        "resume record",
        lambda f: f.resumed,
        ("diff",),
        {"checkpoint": "checkpoints/step-0", "step": 0},
        checked=("checkpoint", "step"),
    ),
    Kind(
        "locate record",
        lambda f: f.location("other"),
        ("report",),
        {"sentence": "runs do not diverge", "step": None, "gap": None, "logs": [], "finding": None},
        checked=("sentence", "step", "finding"),
    ),
    Kind(
        "sweep spec",
        lambda f: f.path.parent / "sweep-x" / "sweep.json",
        ("ls",),
        {"grid": {"lr": ["0.1"]}, "seeds": 1, "command": ["python", "t.py"], "metric": "acc"},
        checked=("grid", "seeds", "command"),
    ),
]
# Kinds of the inventory the matrix leaves to other tests, each with where it is tried.
ELSEWHERE = {
    "config": "read once, by `twice run` at its end: test_a_crafted_process_record_is_refused",
    "process record": "test_a_crafted_process_record_is_refused (a real run writes it)",
    "process records folder": "test_a_crafted_process_record_is_refused",
    "final metrics": "read by `twice stats` of a sweep: tests/e2e/test_sweep.py",
    "op log": "read by locate and audit, which re-run: e2e/test_oplog.py, e2e/test_locate.py",
    "op log, one step": "the old op log form: tests/e2e/test_oplog.py",
    "op logs folder": "the op log readers",
    "dumped op outputs": "written and read by locate's own re-run: tests/e2e/test_locate.py",
    "command output": "a sweep's failed trial: tests/e2e/test_sweep.py",
    "checkpoints": "tests/e2e/test_checkpoint_doors.py, every checkpoint file in every form",
    "checkpoint index": "tests/e2e/test_checkpoint_doors.py",
    "checkpoint state and tensors": "tests/e2e/test_checkpoint_doors.py",
    "DCP metadata": "tests/e2e/test_checkpoint_doors.py (a crafted pickle, resealed)",
    "input digest cache": "the user's cache: a damaged one costs a re-hash (e2e/test_inputs.py)",
    "files the run read": "tests/house/test_doors_read.py (a FIFO, /dev/zero, a link)",
}


def _inventory() -> list[dict]:
    text = ARCHITECTURE.read_text()
    table = text.split("<!-- inventory:read -->")[1].split("<!-- /inventory:read -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append({"kind": cells[0], "where": cells[1], "reader": cells[2], "by": cells[3]})
    return rows


def test_the_inventory_names_every_file_of_a_run_folder():
    listed = {m for row in _inventory() for m in re.findall(r"RunFolder\.(\w+)", row["where"])}
    public = {
        name
        for name, value in vars(RunFolder).items()
        if not name.startswith("_") and isinstance(value, (property, type(lambda: 0)))
    }
    helpers = {"traces", "locations", "proc_records", "claimed_trace", "dumped_output_name"}
    assert public - helpers - listed == set(), "add each file of RunFolder to the inventory"
    assert listed - public == set(), "the inventory names a RunFolder file that is gone"


def test_every_reader_the_inventory_names_exists():
    import importlib

    for row in _inventory():
        for dotted in re.findall(r"`(twice\.[\w.]+)`", row["reader"]):
            module, _, name = dotted.rpartition(".")
            assert hasattr(importlib.import_module(module), name), f"{row['kind']}: {dotted}"


def test_the_matrix_tries_each_kind_through_every_command_the_inventory_says_reads_it():
    by_kind = {row["kind"]: {c.strip() for c in row["by"].split(",")} for row in _inventory()}
    for kind in KINDS:
        assert set(kind.commands) == by_kind[kind.name] & MATRIX_COMMANDS, kind.name


def test_every_kind_read_by_a_command_is_in_the_matrix_or_tried_elsewhere():
    read = {row["kind"] for row in _inventory() if row["reader"] != "written, never read"}
    assert read - {k.name for k in KINDS} - set(ELSEWHERE) == set()
    assert {k.name for k in KINDS} | set(ELSEWHERE) <= read | {"process records folder"}


# ---- the forms ----


def _hostile_strings(value):
    if isinstance(value, str):
        return HOSTILE_TEXT
    if isinstance(value, dict):
        return {k: _hostile_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hostile_strings(v) for v in value]
    return value


def _wrong(value):
    """A value of another JSON type than `value`."""
    if isinstance(value, bool) or value is None:
        return [[]]
    if isinstance(value, (int, float)):
        return "12"
    if isinstance(value, str):
        return 12
    if isinstance(value, list):
        return {"x": 1}
    return [1]


def _records(path: Path, kind: Kind) -> list:
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines()] if kind.lines else [json.loads(text)]


def _write(path: Path, kind: Kind, records: list, raw: str | None = None) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    text = (
        raw
        if raw is not None
        else "".join(json.dumps(r) + "\n" for r in records)
        if kind.lines
        else json.dumps(records[0])
    )
    path.write_text(text)


def _duplicate(records: list, kind: Kind) -> str:
    """The text of `records` with a key of the last record written twice (the last: the one
    record `show` and `ls` read of a trace)."""
    last = records[-1]
    key = sorted(last)[0]
    doubled = "{" + json.dumps(key) + ": " + json.dumps(last[key]) + ", " + json.dumps(last)[1:]
    if not kind.lines:
        return doubled
    return "".join(json.dumps(r) + "\n" for r in records[:-1]) + doubled + "\n"


def _huge(records: list, kind: Kind) -> str:
    """The text of `records` with a 400-digit number in the last record (no double holds it)."""
    last = json.dumps(records[-1])
    huge = '{"huge": 1' + "0" * 400 + ", " + last[1:]
    if not kind.lines:
        return huge
    return "".join(json.dumps(r) + "\n" for r in records[:-1]) + huge + "\n"


def _forms(kind: Kind) -> dict:
    """form name -> (plant(path, records), exits expected, or None: any of 0, 1, 2)."""
    damage = {2}

    def fifo(path, records):
        path.unlink()
        os.mkfifo(path)

    def dev_zero(path, records):
        path.unlink()
        path.symlink_to("/dev/zero")

    def link_out(path, records):
        outside = path.parents[2] / f"outside-{path.name}"
        shutil.copy(path, outside)
        path.unlink()
        path.symlink_to(outside)

    def big(path, records):
        with open(path, "r+b") as handle:
            handle.truncate(1 << 30)

    forms = {
        "missing": (lambda path, records: path.unlink(), None),
        "empty": (lambda path, records: _write(path, kind, [], ""), None if kind.lines else damage),
        "fifo": (fifo, damage),
        "dev_zero": (dev_zero, damage),
        "link_out": (link_out, damage),
        "1GB": (big, damage),
        "deep": (lambda p, r: _write(p, kind, r, "[" * 100_000 + "]" * 100_000 + "\n"), damage),
        "duplicate_key": (lambda p, r: _write(p, kind, r, _duplicate(r, kind)), damage),
        "huge_number": (lambda p, r: _write(p, kind, r, _huge(r, kind)), damage),
        "escapes": (lambda p, r: _write(p, kind, [_hostile_strings(x) for x in r]), None),
    }
    for name in sorted(kind.sample) if kind.sample is not None else kind.checked:

        def wrong(path, records, name=name):
            records = [dict(r) for r in records]
            records[-1][name] = _wrong(records[-1].get(name))
            _write(path, kind, records)

        forms[f"wrong_type:{name}"] = (wrong, damage if name in kind.checked else None)
    for dotted, value in SCHEMA_WRONG.get(kind.name, {}).items():

        def schema_wrong(path, records, dotted=dotted, value=value):
            records = json.loads(json.dumps(records))
            *parents, key = dotted.split(".")
            place = records[-1]
            for parent in parents:
                place = place.setdefault(parent, {})
            place[key] = value
            _write(path, kind, records)

        forms[f"schema:{dotted}"] = (schema_wrong, damage)
    return forms


_CANDIDATES = ([[]], "x", -1, {"x": 1}, True, 2**70, 0.5)


def _schema_wrong() -> dict[str, dict[str, object]]:
    """{kind: {field: a value its own check refuses}}, generated from the validators themselves:
    the manifest's schema (core/manifest_schema.py) and a trace record's (core/records.py)."""
    from twice.core import manifest_schema, records

    manifest = {}
    for section, key, _, check, *_ in (*manifest_schema.FIELDS, *manifest_schema.SHAPES):
        wrong = next(v for v in _CANDIDATES if not _accepts(check, v))
        manifest[f"{section}.{key}"] = wrong
    trace = {
        name: next(v for v in _CANDIDATES if not _accepts(check, v))
        for name, check in records._CHECKS.items()
        if name != "params_before"  # once per trace, on its first line: tried by test_trace.py
    }
    return {"manifest": manifest, "trace": trace}


def _accepts(check, value) -> bool:
    try:
        return bool(check(value))
    except Exception:  # noqa: BLE001 - a check that chokes on a value refuses it
        return False


SCHEMA_WRONG = _schema_wrong()


_RECORDED: dict[str, list] = {}


def _sample_records(kind: Kind) -> list:
    return [kind.sample] if kind.sample is not None else _RECORDED[kind.name]


# ---- the runs ----


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two real runs of one script (runs/a, runs/b), recorded once for every case."""
    base = tmp_path_factory.mktemp("matrix")
    for name in ("a", "b"):
        result = twice(
            "run", "--name", name, "--", sys.executable, str(SCRIPTS / "tiny_train.py"),
            str(base / f"{name}.pt"), cwd=base,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    runs = sorted((base / "runs").iterdir())
    for kind in KINDS:
        if kind.sample is None:
            _RECORDED[kind.name] = _records(kind.path(RunFolder(runs[0])), kind)
    return base, runs


def _cases() -> list[tuple[str, str, str]]:
    cases = [
        (kind.name, form, command)
        for kind in KINDS
        for form in _forms(kind)
        for command in kind.commands
    ]
    if EXHAUSTIVE:
        return cases
    return sorted(random.Random(50).sample(cases, SAMPLE))


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _argv(command: str, a: Path, b: Path, runs: Path, out: Path) -> list[str]:
    return {
        "show": ["show", str(a)],
        "ls": ["ls", "--runs-dir", str(runs)],
        "diff": ["diff", str(a), str(b)],
        "report": ["report", str(a), str(b), "-o", str(out)],
        "nan": ["nan", str(a)],
    }[command]


# The matrix names its cases in full: the kind, the form, the command.
CASES = [pytest.param(*case, id="-".join(case).replace(" ", "_")) for case in _cases()]


@pytest.mark.parametrize("kind_name, form, command", CASES)
def test_a_hostile_file_gives_an_error_or_the_true_verdict(
    recorded, tmp_path, kind_name, form, command
):
    base, (run_a, run_b) = recorded
    kind = next(k for k in KINDS if k.name == kind_name)
    work = tmp_path / "w"
    runs = work / "runs"
    shutil.copytree(base / "runs", runs, symlinks=True)
    a, b = runs / run_a.name, runs / run_b.name
    target = kind.path(RunFolder(a))
    target.parent.mkdir(parents=True, exist_ok=True)
    for run in (a, b) if kind.config else ():
        manifest = json.loads(RunFolder(run).manifest.read_text())
        manifest["identity"]["config"] = {"lr": 0.1}
        RunFolder(run).manifest.write_text(json.dumps(manifest))
    records = _sample_records(kind)
    if kind.sample is not None:
        _write(target, kind, records)
    plant, expected = _forms(kind)[form]
    plant(target, records)
    if form == "missing":
        expected = kind.missing.get(command, {0, 1})
    out = work / "report.html"
    result = subprocess.run(
        [sys.executable, "-m", "twice", *_argv(command, a, b, runs, out)],
        cwd=work,
        env=clean_env(NO_COLOR="1"),
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=120,
        preexec_fn=_limits,
    )
    shown = f"{kind_name} / {form} / {command}: exit {result.returncode}\n{result.stderr[-2000:]}"
    assert result.returncode in (expected or {0, 1, 2}), shown
    assert "Traceback" not in result.stderr, shown
    if result.returncode == 2:
        said = result.stderr.startswith("error:") or "\nerror:" in result.stderr
        assert said or "cannot judge" in result.stdout, shown  # an error, or no verdict, said
    for stream in (result.stdout, result.stderr):
        assert not RAW.search(stream.replace("\n", "").replace("\t", "")), shown
    assert not list(work.rglob("MARKER")), "a hostile string ran as a command"
    if out.exists():
        page = out.read_text()
        assert "<script" not in page.lower() and "Content-Security-Policy" in page


def test_a_crafted_process_record_is_refused(tmp_path):
    """A process that writes procs/<pid>.json naming /dev/zero, a FIFO and a link out of the
    folder as its sources: `twice run` finishes (the record is refused or the sources left
    unhashed), in bounded time and memory."""
    os.mkfifo(tmp_path / "fifo")
    script = tmp_path / "crafty.py"
    script.write_text(
        "import json, os, pathlib\n"
        "run = pathlib.Path(os.environ['TWICE_RUN_DIR'])\n"
        "(run / 'procs').mkdir(exist_ok=True)\n"
        f"sources = ['/dev/zero', {str(tmp_path / 'fifo')!r}]\n"
        "(run / 'procs' / '1.json').write_text(json.dumps({'sources': sources}))\n"
        "(run / 'procs' / '2.json').symlink_to('/dev/zero')\n"
        "os.mkfifo(run / 'procs' / '3.json')\n"
        "(run / 'config.json').symlink_to('/dev/zero')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "twice", "run", "--", sys.executable, str(script)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limits,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    shown = subprocess.run(
        [sys.executable, "-m", "twice", "show", str(run), "--json"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    manifest = json.loads(shown.stdout)
    sources = manifest["identity"]["code"]["sources"]
    assert sources.get("/dev/zero") is None and sources.get(str(tmp_path / "fifo")) is None
    assert manifest["context"].get("damaged_config") is True


def _streams_stray(a: Path) -> None:
    """A damaged trace.jsonl beside a stray copy of the good one (trace_orig.jsonl)."""
    trace = RunFolder(a).trace()
    shutil.copy(trace, a / "trace_orig.jsonl")
    shutil.copy(trace, a / "trace~.jsonl")
    trace.write_text(trace.read_text().replace('"loss":"', '"loss":"x', 1))


def _streams_unlisted(a: Path) -> None:
    """A trace file the manifest does not list: never merged (the runs stay identical)."""
    shutil.copy(RunFolder(a).trace(), a / "trace.rank9.jsonl")


def _streams_missing(a: Path) -> None:
    """The manifest lists a stream whose file is gone."""
    manifest = json.loads(RunFolder(a).manifest.read_text())
    manifest["context"]["streams"] = ["main", "rank1"]
    RunFolder(a).manifest.write_text(json.dumps(manifest))


def _resumed_prefix(a: Path) -> None:
    """A run that says it resumed at step 3, whose skipped prefix is not JSON."""
    RunFolder(a).resumed.write_text(json.dumps({"checkpoint": "c", "step": 3}))
    trace = RunFolder(a).trace()
    lines = trace.read_text().splitlines(keepends=True)
    lines[0] = '{this is not JSON,"step":0}\n'
    trace.write_text("".join(lines))


def _capture_error_empty(a: Path) -> None:
    RunFolder(a).capture_error.write_text("{}")


def _duplicate_loss(a: Path) -> None:
    trace = RunFolder(a).trace()
    lines = trace.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace('{"', '{"loss":"0x1.0p+0","', 1)
    trace.write_text("".join(lines))


# The examples issue 50 gave of each class: (plant, the exit diff must give).
EXAMPLES = {
    "stray trace files beside a damaged trace": (_streams_stray, 2),
    "an unlisted stream file": (_streams_unlisted, 0),
    "a listed stream that is missing": (_streams_missing, 2),
    "a resumed run's skipped prefix that is not JSON": (_resumed_prefix, 2),
    "capture_error.json holding {}": (_capture_error_empty, 2),
    "a record with a duplicate key": (_duplicate_loss, 2),
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_issues_examples_give_an_error_never_bit_identical(recorded, tmp_path, example):
    base, (run_a, run_b) = recorded
    runs = tmp_path / "runs"
    shutil.copytree(base / "runs", runs)
    a, b = runs / run_a.name, runs / run_b.name
    plant, expected = EXAMPLES[example]
    plant(a)
    result = subprocess.run(
        [sys.executable, "-m", "twice", "diff", str(a), str(b)],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == expected, (example, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    if expected == 2:
        assert "error:" in result.stderr and "bit-identical" not in result.stdout
