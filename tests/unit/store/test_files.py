"""Atomic writes: the old file or the new one, never half; canonical JSON with non-finite floats as
text; an output path refused before any work."""

import json
import os

import pytest

from twice.core.errors import UsageError
from twice.store import reader
from twice.store.files import (
    check_output_path,
    current_umask,
    dumps,
    finite_json,
    write_bytes_atomic,
    write_json_atomic,
)


def test_json_is_written_canonical_and_reads_back_through_the_strict_reader(tmp_path):
    value = {"b": [1, float("nan")], "a": {"inf": float("inf"), "é": -float("inf")}}
    assert dumps(value) == (
        '{\n  "a": {\n    "inf": "inf",\n    "é": "-inf"\n  },\n'
        '  "b": [\n    1,\n    "nan"\n  ]\n}\n'
    )
    write_json_atomic(tmp_path / "m.json", value)
    assert reader.read_json(tmp_path / "m.json") == json.loads(dumps(value))
    assert finite_json((1.5, [float("-inf")])) == [1.5, ["-inf"]]


def test_a_write_replaces_the_file_whole_with_a_new_files_permissions_and_leaves_nothing(
    tmp_path,
):
    path = tmp_path / "trace.json"
    path.write_bytes(b"old contents, longer than the new")
    os.chmod(path, 0o600)
    write_bytes_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert path.stat().st_mode & 0o777 == 0o666 & ~current_umask()
    assert os.listdir(tmp_path) == ["trace.json"]  # no temporary file left


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_bytes_atomic(path, "not bytes")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["manifest.json"]


def test_the_umask_is_read_without_changing_it():
    mask = os.umask(0o027)
    try:
        assert current_umask() == 0o027 and current_umask() == 0o027
    finally:
        os.umask(mask)


def test_an_output_path_that_cannot_be_written_is_refused_naming_why(tmp_path):
    (tmp_path / "a_file").write_text("")
    cases = {
        tmp_path: "it is a folder",
        tmp_path / "a_file" / "report.html": "is a file, not a folder",
        tmp_path / "missing" / "report.html": "does not exist",
    }
    for path, why in cases.items():
        with pytest.raises(UsageError, match=why):
            check_output_path(path, "report")
    assert check_output_path(tmp_path / "report.html", "report") == tmp_path / "report.html"
