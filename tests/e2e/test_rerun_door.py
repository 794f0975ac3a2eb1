"""The one door to a re-run: the manifest the trust check admitted is the one executed.

Each command that re-runs a run folder (verify, verify --segments, verify --resume-at, locate,
bisect) is called on real run folders recorded by the real `twice run`. Right after the trust
check has looked at a folder (or while the user is asked about it), its manifest.json is replaced
by a crafted, unsigned one whose command creates a marker file: that command must never run, and
every re-run must execute the command that was checked. An AST scan keeps every re-run going
through app/rerun.py's one start, from a Rerun that only app/trust.py makes.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env, runs, script, twice

import twice as package
from twice.app import trust

APP = Path(package.__file__).parent / "app"

# Four SGD steps; a file "bump" beside it scales step 1's loss, so two recordings differ there.
BUMPED = """\
import pathlib, torch
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(4):
    opt.zero_grad()
    scale = 1.5 if step == 1 and pathlib.Path("bump").exists() else 1.0
    ((w * w).sum() * scale).backward()
    opt.step()
"""


def _record(tmp_path: Path, name: str, *args: str, text: str = BUMPED) -> Path:
    (tmp_path / "bumped.py").write_text(text)
    result = twice("run", "--name", name, *args, "--", sys.executable, "bumped.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return next(r for r in runs(tmp_path) if r.name.endswith("-" + name))


def _craft(run_dir: Path, marker: Path) -> None:
    """Replace `run_dir`'s manifest by one signed by nobody whose command creates `marker`."""
    path = Path(run_dir) / "manifest.json"
    data = json.loads(path.read_text())
    data["identity"]["argv"] = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    data["context"].pop("signature", None)
    path.write_text(json.dumps(data))


def _argv(run_dir: Path) -> list[str]:
    return json.loads((Path(run_dir) / "manifest.json").read_text())["identity"]["argv"]


@pytest.fixture
def swap_after_check(monkeypatch, tmp_path):
    """Every folder the trust check looks at gets a crafted manifest right after the check."""
    marker = tmp_path / "CRAFTED-RAN"
    checked: list[Path] = []
    real = trust.foreign_reason

    def check_then_swap(run_dir, manifest):
        reason = real(run_dir, manifest)
        checked.append(Path(run_dir))
        _craft(Path(run_dir), marker)
        return reason

    monkeypatch.setattr(trust, "foreign_reason", check_then_swap)
    return marker, checked


def _assert_only_checked_commands_ran(tmp_path, originals: dict[Path, list[str]], marker, least):
    """No crafted command ran; every new run folder executed one of the checked commands."""
    assert not marker.exists(), "the swapped-in manifest's command ran"
    reruns = [r for r in runs(tmp_path) if r not in originals]
    assert len(reruns) >= least, reruns
    checked = list(originals.values())
    for rerun in reruns:
        assert _argv(rerun) in checked, (rerun, _argv(rerun))


def test_verify_runs_the_checked_command(tmp_path, swap_after_check):
    from twice.app.verify import verify_run

    marker, checked = swap_after_check
    run = _record(tmp_path, "orig")
    original = _argv(run)
    verify_run(run, quiet=True)
    assert checked == [run]
    _assert_only_checked_commands_ran(tmp_path, {run: original}, marker, 1)


@pytest.fixture
def segmented(tmp_path):
    """A 12-step run checkpointed after steps 3, 6, 9 and 12 (tests/e2e/scripts/segments.py)."""
    script("segments.py", tmp_path)
    result = twice("run", "--name", "orig", "--", sys.executable, "segments.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return runs(tmp_path)[-1]


def test_verify_segments_runs_the_checked_command_in_every_segment(
    tmp_path, segmented, swap_after_check
):
    from twice.app.segments import verify_segments

    marker, checked = swap_after_check
    original = _argv(segmented)
    check = verify_segments(segmented, 2, seed=0, jobs=1)
    assert checked == [segmented] and len(check.checked) == 2
    _assert_only_checked_commands_ran(tmp_path, {segmented: original}, marker, 2)


def test_verify_resume_at_runs_the_checked_command_stopped_and_resumed(
    tmp_path, segmented, swap_after_check
):
    from twice.app.verify import verify_resume_of_run

    marker, checked = swap_after_check
    original = _argv(segmented)
    check = verify_resume_of_run(segmented, 6)
    assert checked == [segmented] and check.identical, check.verdict
    _assert_only_checked_commands_ran(tmp_path, {segmented: original}, marker, 2)


@pytest.fixture
def diverging(tmp_path):
    """Runs A and B of bumped.py that differ from step 1 on (B saw the bump file); traced every
    step when `request.param` is 1, every other step when 2."""

    def record(trace_every: int) -> tuple[Path, Path]:
        args = ("--trace-every", str(trace_every))
        a = _record(tmp_path, "a", *args)
        (tmp_path / "bump").touch()
        b = _record(tmp_path, "b", *args)
        (tmp_path / "bump").unlink()  # the re-runs of both then compute the same
        return a, b

    return record


def test_locate_runs_the_checked_commands_of_both_runs(tmp_path, diverging, swap_after_check):
    from twice.app.locate import locate_runs

    marker, checked = swap_after_check
    a, b = diverging(1)
    originals = {a: _argv(a), b: _argv(b)}
    location = locate_runs(a, b)
    assert checked == [a, b] and location.step == 1, location.sentence
    _assert_only_checked_commands_ran(tmp_path, originals, marker, 2)


def test_bisect_runs_the_checked_commands_in_every_replay(tmp_path, diverging, swap_after_check):
    from twice.app.locate import bisect_divergence

    marker, checked = swap_after_check
    a, b = diverging(2)
    originals = {a: _argv(a), b: _argv(b)}
    found = bisect_divergence(a, b)
    assert checked == [a, b] and found.replays == 1 and found.step == 2, found
    _assert_only_checked_commands_ran(tmp_path, originals, marker, 2)


def _foreign(run_dir: Path) -> None:
    """Make `run_dir` a folder from elsewhere: its signature gone, its command unchanged."""
    path = run_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["context"].pop("signature")
    path.write_text(json.dumps(data))


def test_the_confirmed_command_is_the_one_run_not_a_later_read(tmp_path):
    """The question shows the command; a manifest swapped while the user reads it is not run."""
    from twice.app.verify import verify_run

    run = _record(tmp_path, "orig")
    original = _argv(run)
    _foreign(run)
    marker, asked = tmp_path / "CRAFTED-RAN", []

    def confirm(message: str) -> bool:
        asked.append(message)
        _craft(run, marker)
        return True

    verify_run(run, quiet=True, yes=confirm)
    assert len(asked) == 1 and "it carries no signature" in asked[0]
    assert asked[0].endswith("it would run: " + " ".join(original))
    _assert_only_checked_commands_ran(tmp_path, {run: original}, marker, 1)


def test_locate_asks_about_each_folder_from_elsewhere_with_its_own_command(tmp_path):
    """Once a question about A was answered, B's command was run unshown; now each is asked."""
    from twice.app.locate import locate_runs

    a = _record(tmp_path, "a", text="print('a')\n")
    b = _record(tmp_path, "b", text="print('b')\n")
    for run in (a, b):
        _foreign(run)
    asked = []
    located = locate_runs(a, b, yes=lambda message: asked.append(message) or True)
    assert [message.split(":", 1)[0] for message in asked] == [
        f"not re-running the command of {a}",
        f"not re-running the command of {b}",
    ]
    assert located.finding is None and len(runs(tmp_path)) == 2


def test_a_refused_question_runs_nothing(tmp_path):
    from twice.app.verify import verify_run

    run = _record(tmp_path, "orig")
    _foreign(run)
    with pytest.raises(trust.UntrustedRun):
        verify_run(run, quiet=True, yes=lambda message: False)
    assert len(runs(tmp_path)) == 1


def _read_until(fd: int, text: bytes, seconds: float) -> bytes:
    seen, deadline = b"", time.monotonic() + seconds
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            seen += chunk
    return seen


def test_the_command_line_question_runs_what_it_showed(tmp_path):
    """`twice verify` on a terminal: the manifest is replaced while the question waits; the
    answer "y" runs the command shown, and nothing is read again."""
    run = _record(tmp_path, "orig")
    original = _argv(run)
    _foreign(run)
    marker = tmp_path / "CRAFTED-RAN"
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "twice", "verify", "-q", str(run)],
        cwd=tmp_path,
        env=clean_env(),
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    try:
        shown = _read_until(process.stderr.fileno(), b"run it?", 60)
        assert b"it would run: " in shown and b"run it?" in shown, shown
        _craft(run, marker)
        os.write(leader, b"y\n")
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    assert process.returncode in (0, 1), err
    _assert_only_checked_commands_ran(tmp_path, {run: original}, marker, 1)


def test_a_sweep_retries_its_command_line_never_a_trials_recorded_command(tmp_path):
    """A sweep run again retries a failed trial with the command it is given: the trial's
    manifest, edited, is read for its status only."""
    (tmp_path / "trial.py").write_text(
        "import pathlib, sys\nsys.exit(0 if pathlib.Path('fixed').exists() else 3)\n"
    )
    sweep = (
        "sweep",
        "--vary",
        "x=1",
        "--seeds",
        "1",
        "--name",
        "s",
        "--",
        sys.executable,
        "trial.py",
        "{x}",
    )
    assert twice(*sweep, cwd=tmp_path).returncode == 1
    (failed,) = (tmp_path / "runs" / "s" / "trials").iterdir()
    original = _argv(failed)
    marker = tmp_path / "CRAFTED-RAN"
    _craft(failed, marker)
    (tmp_path / "fixed").touch()
    result = twice(*sweep, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    retried = [t for t in (tmp_path / "runs" / "s" / "trials").iterdir() if t != failed]
    assert [_argv(t) for t in retried] == [original]


# -- the door, on the source ----------------------------------------------------------------------

# Functions of app/ that may start a command (run_command), each with where its command comes from.
# A re-run of a run folder starts only in rerun.start_rerun, from a Rerun.
STARTERS = {
    ("rerun", "start_rerun"): "the one start of a re-run: a Rerun the trust check admitted",
    ("verify", "start"): "verify_resume's: `twice verify-resume -- COMMAND`'s command (a Rerun "
    "goes to start_rerun)",
    ("sweep", "one"): "the sweep's command from the command line",
    ("sweep", "_ray_trial"): "the sweep's command from the command line, in a Ray worker",
    ("audit", "audit_command"): "`twice audit -- COMMAND`'s command",
    ("portability", "portable_audit"): "`twice audit --portable -- COMMAND`'s command",
}
# Re-running modules, and the functions of theirs that may read a manifest, each with why.
RERUNNING = {"rerun", "verify", "segments", "locate"}
MANIFEST_READERS = {
    ("verify", "verify_resume"): "the straight run's exit code (a run it made or was given)",
    ("verify", "verify_resume_of_run"): "the one read: its status checked, then admitted",
    ("segments", "verify_segments"): "the one read: its segments planned, then admitted",
    ("segments", "_check"): "the segment re-run's own status",
}


def _calls(module: str):
    """(enclosing function, called name) of every call in app/`module`.py."""
    tree = ast.parse((APP / f"{module}.py").read_text())

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                yield inner, name, func
            yield from visit(child, inner)

    yield from visit(tree, None)


def _modules():
    return sorted(p.stem for p in APP.glob("*.py"))


def test_every_command_start_in_app_is_listed_with_where_its_command_comes_from():
    found = {
        (module, function)
        for module in _modules()
        if module != "launch"
        for function, name, _ in _calls(module)
        if name == "run_command"
    }
    assert found <= set(STARTERS), f"a new start of a command: {found - set(STARTERS)}"
    assert found == set(STARTERS), f"listed but gone: {set(STARTERS) - found}"


def test_only_launch_starts_processes_and_only_trust_makes_a_rerun():
    spawners = {"Popen", "system", "spawnv", "spawnl", "execv", "execvp", "execve", "fork"}
    for module in _modules():
        for function, name, func in _calls(module):
            where = f"app/{module}.py {function}"
            of_subprocess = getattr(getattr(func, "value", None), "id", "") == "subprocess"
            if name in spawners or (of_subprocess and name in {"run", "call", "check_output"}):
                assert module == "launch", f"{where} starts a process around run_command"
            if name in {"Rerun", "foreign_reason", "_signature"}:
                assert module == "trust", f"{where} calls {name}: only the trust check may"


def test_re_running_modules_read_manifests_only_where_listed():
    found = set()
    for module in RERUNNING:
        tree = ast.parse((APP / f"{module}.py").read_text())
        for function, name, _ in _calls(module):
            if name in {"read_manifest", "read_json", "loads", "load"}:
                found.add((module, function))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "manifest":
                found.add((module, "a RunFolder's manifest path"))
    assert found == set(MANIFEST_READERS), found ^ set(MANIFEST_READERS)


def test_a_rerun_cannot_be_made_or_changed_outside_the_trust_check(tmp_path):
    import dataclasses

    from twice.app.rerun import start_rerun
    from twice.store.runs import read_manifest

    run = _record(tmp_path, "orig", text="print('hi')\n")
    rerun = trust.admit(run, read_manifest(run))
    fields = {f.name: getattr(rerun, f.name) for f in dataclasses.fields(rerun)}
    with pytest.raises(TypeError):
        trust.Rerun(**fields)
    with pytest.raises((TypeError, ValueError)):
        dataclasses.replace(rerun, argv=("touch", str(tmp_path / "x")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rerun.argv = ("touch", str(tmp_path / "x"))
    with pytest.raises(TypeError):
        start_rerun(read_manifest(run), None)
    assert isinstance(rerun.env, tuple) and rerun.argv == tuple(_argv(run))
    assert pickle.loads(pickle.dumps(rerun)) == rerun  # a Ray task of --segments gets it whole
