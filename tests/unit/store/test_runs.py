"""store: the run folder's layout, and its readers validating what they read (a damaged file is an
error with a hint and exit 2, never a verdict)."""

import json
import time

import pytest
from click.testing import CliRunner

from twice.cli import main
from twice.core.errors import CorruptRecord, RunNotFound
from twice.store.files import write_json_atomic
from twice.store.runs import effective_status, new_run_dir, read_manifest, summarize_run

GOOD = {
    "identity": {"argv": ["python", "train.py"], "seed": 0, "determinism": {"mode": "strict"}},
    "context": {"status": "completed", "exit_code": 0, "steps": 3, "started": 1.5, "cwd": "/tmp"},
}


def _with(part=None, key=None, value=None, whole=None):
    if whole is not None:
        return whole
    data = json.loads(json.dumps(GOOD))
    data[part][key] = value
    return data


def test_a_good_manifest_reads_into_a_typed_record(tmp_path):
    run = new_run_dir(tmp_path, "good")
    write_json_atomic(run / "manifest.json", GOOD)
    manifest = read_manifest(run)
    assert (manifest.argv, manifest.seed, manifest.steps, manifest.determinism) == (
        ["python", "train.py"],
        0,
        3,
        "strict",
    )
    assert (
        effective_status(manifest) == "completed"
        and summarize_run(run)["command"] == "python train.py"
    )


@pytest.mark.parametrize(
    "damaged",
    [
        _with(whole=[]),
        _with(whole={"identity": {}, "context": []}),
        _with("identity", "argv", 3),
        _with("identity", "argv", ["python", None]),
        _with("identity", "seed", "0"),
        _with("identity", "seed", True),
        _with("identity", "seed", 2**70),
        _with("identity", "env", {"OMP_NUM_THREADS": 1}),
        _with("context", "status", None),
        _with("context", "steps", -1),
        _with("context", "exit_code", 0.5),
        _with("context", "started", "yesterday"),
        _with("context", "launcher", {"pid": 2**40}),
        _with("context", "trace_every", 0),
    ],
)
def test_a_damaged_manifest_is_a_corrupt_record_naming_the_key_and_exit_2_from_every_command(
    tmp_path, damaged
):
    run = new_run_dir(tmp_path, "bad")
    (run / "manifest.json").write_text(json.dumps(damaged))
    with pytest.raises(CorruptRecord, match="manifest.json") as caught:
        read_manifest(run)
    assert caught.value.hint
    other = new_run_dir(tmp_path, "good")
    write_json_atomic(other / "manifest.json", GOOD)
    for args in (["show", str(run)], ["diff", str(other), str(run)], ["ls", str(tmp_path)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert (
            "error: " in result.output
            and "hint: " in result.output
            and "identical" not in result.output
        )


def test_unreadable_and_deeply_nested_manifests_are_errors_too(tmp_path):
    run = new_run_dir(tmp_path, "deep")
    (run / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CorruptRecord):
        read_manifest(run)
    (run / "manifest.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(CorruptRecord):
        read_manifest(run)
    (run / "manifest.json").unlink()
    with pytest.raises(RunNotFound):
        read_manifest(run)


def test_run_ids_sort_by_time_and_stay_unique_when_many_start_at_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda _: new_run_dir(tmp_path / "runs"), range(64)))
    assert len(set(made)) == 64
    later = new_run_dir(tmp_path / "runs")
    time.sleep(0.002)
    last = new_run_dir(tmp_path / "runs")
    assert sorted([later.name, last.name]) == [later.name, last.name]
