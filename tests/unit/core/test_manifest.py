"""The manifest record: identity compared key by key and grouped, context never compared, the
recording settings apart, and a manifest read only through its schema."""

import pytest

from twice.core.errors import CorruptRecord
from twice.core.manifest import (
    MISSING,
    Difference,
    Manifest,
    compare_identity,
    group_of,
    recording_differences,
)


def test_identity_differences_are_grouped():
    diffs = compare_identity(
        {"argv": ["a"], "packages": {"numpy": "1"}, "env": {"OMP_NUM_THREADS": "1"}},
        {"argv": ["b"], "packages": {"numpy": "2"}, "env": {}},
    )
    assert [(d.group, d.key) for d in diffs] == [
        ("arguments", "argv"),
        ("packages", "packages.numpy"),
        ("threads", "env.OMP_NUM_THREADS"),
    ]
    assert isinstance(diffs[0], Difference)


def test_a_key_one_run_lacks_is_missing_and_an_empty_object_is_no_difference():
    diffs = compare_identity({"seed": 0, "env": {}}, {"seed": 0, "code": {"sources": {}}})
    assert diffs == []
    diffs = compare_identity({"seed": 0}, {"seed": 0, "inputs": {"data.bin": "ab"}})
    assert diffs == [Difference("data", "inputs.data.bin", MISSING, "ab")]
    assert diffs[0].to_json() == {
        "group": "data",
        "key": "inputs.data.bin",
        "a": MISSING,
        "b": "ab",
    }


def test_groups_come_in_their_order_whatever_the_keys_alphabet():
    a = {"seed": 1, "argv": ["x"], "env": {"LANG": "C"}, "cpu": {"model": "a"}, "zzz": 1}
    b = {"seed": 2, "argv": ["y"], "env": {"LANG": "en"}, "cpu": {"model": "b"}, "zzz": 2}
    groups = [d.group for d in compare_identity(a, b)]
    assert groups == ["arguments", "hardware", "environment", "environment", "seeds"]
    assert group_of("env.MKL_NUM_THREADS") == "threads" and group_of("env.HOME") == "environment"
    assert group_of("gpus") == "hardware" and group_of("something.new") == "environment"


def test_package_files_differ_only_where_both_runs_recorded_them_under_one_version():
    same_version = compare_identity(
        {"packages": {"torch": "2.5"}, "package_files": {"torch": "aa"}},
        {"packages": {"torch": "2.5"}, "package_files": {"torch": "bb"}},
    )
    assert [d.key for d in same_version] == ["package_files.torch"]
    new_version = compare_identity(
        {"packages": {"torch": "2.5"}, "package_files": {"torch": "aa"}},
        {"packages": {"torch": "2.6"}, "package_files": {"torch": "bb"}},
    )
    assert [d.key for d in new_version] == ["packages.torch"]  # the version says it better
    older = compare_identity(
        {"packages": {"torch": "2.5"}},
        {"packages": {"torch": "2.5"}, "package_files": {"torch": "bb"}},
    )
    assert older == []


def _manifest(identity=None, **context):
    return Manifest(
        {"argv": ["python", "train.py"], **(identity or {})}, {"status": "completed", **context}
    )


def test_the_recording_settings_differ_as_recording_never_as_identity():
    a = _manifest(recording={"trace_every": 1, "params_every": 10})
    b = _manifest(recording={"trace_every": 5, "params_every": 10, "mlflow": True})
    assert recording_differences(a, b) == [
        Difference("recording", "--trace-every", 1, 5),
        Difference("recording", "--mlflow", False, True),
    ]
    assert compare_identity(a.identity, b.identity) == []


def test_a_manifest_written_before_context_recording_reads_its_settings_from_the_context():
    old = _manifest(trace_every=3, params_every=7, stop_after=100)
    assert old.recording == {
        "trace_every": 3,
        "params_every": 7,
        "max_steps": 100,
        "inputs": [],
        "inputs_exclude": [],
        "mlflow": False,
    }
    assert (
        recording_differences(
            old, _manifest(recording={"trace_every": 3, "params_every": 7, "max_steps": 100})
        )
        == []
    )


def test_from_json_gives_typed_access_and_refuses_a_field_of_another_shape():
    data = {
        "identity": {"argv": ["python", "t.py"], "seed": 3, "determinism": {"mode": "warn"}},
        "context": {"status": "completed", "steps": 12},
    }
    manifest = Manifest.from_json(data, "runs/a/manifest.json")
    assert (manifest.argv, manifest.seed, manifest.determinism) == (["python", "t.py"], 3, "warn")
    assert (manifest.steps, manifest.trace_every, manifest.cwd) == (12, 1, ".")
    assert Manifest.from_json(manifest.to_json(), "again") == manifest
    data["identity"]["seed"] = "3"
    with pytest.raises(CorruptRecord, match=r"runs/a/manifest.json: identity.seed must be"):
        Manifest.from_json(data, "runs/a/manifest.json")
    with pytest.raises(CorruptRecord, match="identity must be an object"):
        Manifest.from_json({"identity": [], "context": {}}, "m.json")
