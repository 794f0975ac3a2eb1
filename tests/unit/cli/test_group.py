"""The command line itself (click's CliRunner, in process): listing, showing, errors, exit codes."""

import ast
import json
from pathlib import Path

import click
from click.testing import CliRunner

import twice.cli
from twice.app.options import DEFAULT_SEED, root_seed
from twice.cli import main
from twice.store.files import write_json_atomic
from twice.store.runs import new_run_dir


def _run_folder(runs, name="base", steps=3):
    path = new_run_dir(runs, name)
    manifest = {
        "identity": {"argv": ["python", "train.py"], "seed": 0, "determinism": {"mode": "strict"}},
        "context": {"status": "completed", "exit_code": 0, "steps": steps, "started": None},
    }
    write_json_atomic(path / "manifest.json", manifest)
    return path


def test_ls_lists_runs_and_json_lists_their_summaries(tmp_path):
    runs = tmp_path / "runs"
    path = _run_folder(runs)
    result = CliRunner().invoke(main, ["ls", str(runs)])
    assert result.exit_code == 0
    assert result.output == CliRunner().invoke(main, ["ls", "--runs-dir", str(runs)]).output
    header, _, line = result.output.splitlines()
    assert header.split()[:3] == ["run", "id", "status"]
    short = "-".join(path.name.split("-", 4)[:4])  # the id; the run's name has its own column
    assert line.split() == ["base", short, "completed", "?", "-", "3", "-", "python", "train.py"]
    listed = json.loads(CliRunner().invoke(main, ["ls", str(runs), "--json"]).output)
    assert [row["id"] for row in listed["runs"]] == [path.name] and listed["runs"][0]["steps"] == 3
    assert listed["sweeps"] == []


def test_show_prints_the_run_and_json_adds_its_effective_status(tmp_path):
    runs = tmp_path / "runs"
    path = _run_folder(runs)
    result = CliRunner().invoke(main, ["show", str(path)])
    assert result.exit_code == 0 and result.output.startswith(
        f"run {path.name}: completed (exit 0)\n"
    )
    shown = json.loads(CliRunner().invoke(main, ["show", str(path), "--json"]).output)
    assert shown["context"]["effective_status"] == "completed"


def test_bad_input_is_an_error_with_a_hint_and_exit_2_never_a_traceback(tmp_path):
    runner = CliRunner()
    cases = (
        ["ls", str(tmp_path / "nowhere")],
        ["show", "nothing", "--runs-dir", str(tmp_path)],
        ["checkpoint", "verify", str(tmp_path)],
        ["run", "--nope"],
        ["diff", "a"],
    )
    for args in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 2, args
        assert "error: " in result.output and "hint: " in result.output, args
        assert "Traceback" not in result.output, args


def test_nan_exits_1_for_a_recorded_fault_and_0_without(tmp_path):
    path = _run_folder(tmp_path / "runs")
    assert CliRunner().invoke(main, ["nan", str(path)]).exit_code == 0
    (path / "numerics.jsonl").write_text(
        json.dumps({"kind": "non_finite", "step": 4, "summary": "loss is nan at step 4"}) + "\n"
    )
    result = CliRunner().invoke(main, ["nan", str(path)])
    assert result.exit_code == 1 and "non-finite values recorded from step 4" in result.output


def _commands(group: click.Group, prefix: str = ""):
    """(full name, command) of every command under `group`, subgroups' commands too."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_every_command_takes_the_one_seed_option_with_one_default_and_help():
    seeds = {
        name: param
        for name, command in _commands(main)
        for param in command.params
        if "--seed" in param.opts
    }
    assert set(seeds) == {"run", "verify", "verify-resume", "audit"}
    shapes = {(p.name, p.default, p.help, p.type, p.show_default) for p in seeds.values()}
    assert len(shapes) == 1, shapes
    (name, default, *_), *_ = shapes
    assert (name, default) == ("seed", None)  # None: not given, each command's meaning of it
    assert root_seed(None) == DEFAULT_SEED and root_seed(7) == 7


def test_the_command_line_spells_seed_once():
    spelled = [
        (path.name, node.lineno)
        for path in sorted(Path(twice.cli.__file__).parent.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == "--seed"
    ]
    assert [name for name, _ in spelled] == ["group.py"], spelled


def test_run_refuses_a_seed_with_observe_and_names_both():
    result = CliRunner().invoke(main, ["run", "--observe", "--seed", "0", "--", "true"])
    assert result.exit_code == 2
    assert "cannot also seed it" in result.output and "drop --seed or --observe" in result.output


def test_the_group_suggests_an_option_shows_tracebacks_under_debug_and_prints_sorted_json(
    tmp_path,
):
    from twice.cli.group import TwiceGroup, json_text
    from twice.core.errors import RunNotFound

    assert isinstance(main, TwiceGroup)
    typo = CliRunner().invoke(main, ["ls", "--jsn"])
    assert typo.exit_code == 2
    assert typo.output == "error: unknown option --jsn\nhint: did you mean --json?\n"
    debug = CliRunner().invoke(main, ["--debug", "show", "nothing", "--runs-dir", str(tmp_path)])
    assert isinstance(debug.exception, RunNotFound)  # raised as it is, traceback and all
    assert json_text({"b": [1], "a": None}) == '{\n  "a": null,\n  "b": [\n    1\n  ]\n}'
