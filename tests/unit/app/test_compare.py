"""app/compare: two run folders compared, manifests then traces, with the verdict first and the
exit code it gives (0 the same, 1 a difference, 2 nothing to judge)."""

from twice.app.compare import compare_runs
from unit.app.folders import steps, write_run


def test_runs_that_record_the_same_steps_are_bit_identical(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5, 1.25]))
    b = write_run(tmp_path / "b", steps([2.0, 1.5, 1.25]))
    result = compare_runs(a, b)
    assert result.identical and result.exit_code == 0 and result.divergence is None
    assert result.verdict == "runs are bit-identical: 3 steps compared"
    assert result.to_json()["steps"] == {"main": [3, 3]} and result.compared_steps == 3


def test_the_first_differing_step_and_field_lead_the_verdict(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5, 1.25, 1.0]))
    b = write_run(tmp_path / "b", steps([2.0, 1.5, 1.3, 1.1]))
    result = compare_runs(a, b)
    assert result.exit_code == 1 and not result.identical
    assert result.divergence.step == 2 and result.divergence.stream == "main"
    assert result.verdict.startswith("runs differ: first divergence at step 2")
    assert compare_runs(a, b, steps=2).identical  # only the first two steps compared


def test_a_changed_seed_is_named_and_a_run_with_no_step_cannot_be_judged(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5]))
    b = write_run(tmp_path / "b", steps([2.0, 1.4]), identity={"seed": 1})
    result = compare_runs(a, b)
    assert [(d.key, d.a, d.b) for d in result.differences] == [("seed", 0, 1)]
    assert "seed" in result.explanation
    empty = write_run(tmp_path / "empty", [], status="crashed")
    unjudged = compare_runs(a, empty)
    assert unjudged.exit_code == 2 and unjudged.verdict.startswith("cannot judge")


def test_a_scripts_path_is_named_as_its_seeding_call_sites_name_it():
    """Typed absolute or relative, a script under the working folder is named relative to it
    (as runtime/seedcalls.py names call sites); one outside it, absolute."""
    from types import SimpleNamespace

    from twice.app.compare import _script_path

    def manifest(path):
        return SimpleNamespace(
            identity={"code": {"script": {"path": path}}}, context={"cwd": "/work/run"}
        )

    assert _script_path(manifest("/work/run/sub/train.py")) == "sub/train.py"
    assert _script_path(manifest("sub/../train.py")) == "train.py"
    assert _script_path(manifest("../other/train.py")) == "/work/other/train.py"
    assert _script_path(SimpleNamespace(identity={"code": {}}, context={})) is None
