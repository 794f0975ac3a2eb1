"""The exception tree: every error's exit code, its `error:`/`hint:` rendering, and an OSError
told as what was being done."""

import errno

import pytest

from twice.core.errors import (
    CheckpointError,
    CorruptRecord,
    DeterminismError,
    Exit,
    RunNotFound,
    TwiceError,
    UsageError,
    from_os_error,
)


def test_the_exit_table_keeps_three_for_internal_errors():
    assert (Exit.SAME, Exit.DIFFER, Exit.USAGE, Exit.INTERNAL) == (0, 1, 2, 3)
    assert Exit.NUMERICS not in (0, 1, 2, 3)


@pytest.mark.parametrize(
    "kind", [UsageError, RunNotFound, CorruptRecord, DeterminismError, CheckpointError]
)
def test_every_error_is_a_twice_error_that_exits_2_never_a_verdicts_1(kind):
    error = kind("the trace is cut short", "record the run again")
    assert isinstance(error, TwiceError) and error.exit_code == Exit.USAGE == 2


def test_an_error_renders_as_error_and_hint_lines_and_shows_its_hint_in_a_traceback():
    error = CorruptRecord("line 4 of trace.jsonl is not JSON", "the file was cut short")
    assert (
        error.render() == "error: line 4 of trace.jsonl is not JSON\nhint: the file was cut short"
    )
    assert str(error) == "line 4 of trace.jsonl is not JSON\nhint: the file was cut short"
    bare = UsageError("no such run")
    assert bare.render() == "error: no such run" and str(bare) == "no such run"


def test_a_failed_read_names_what_was_done_the_reason_the_path_and_a_hint(tmp_path):
    missing = tmp_path / "absent" / "manifest.json"
    with pytest.raises(OSError) as raised:
        open(missing, "w")
    error = from_os_error(raised.value, "write the manifest")
    assert isinstance(error, UsageError)
    assert error.message == f"cannot write the manifest: No such file or directory ({missing})"
    assert (
        error.hint == "a folder on the path does not exist: create it first, or choose another path"
    )


def test_a_file_where_a_folder_belongs_gets_its_own_hint_and_an_unknown_errno_a_general_one(
    tmp_path,
):
    (tmp_path / "runs").write_text("")
    with pytest.raises(OSError) as raised:
        (tmp_path / "runs" / "a").mkdir()
    assert raised.value.errno == errno.ENOTDIR
    assert from_os_error(raised.value, "create the run folder").hint.startswith(
        "a part of the path"
    )
    other = from_os_error(OSError(errno.EIO, "Input/output error"), "read the trace")
    assert other.message == "cannot read the trace: Input/output error"
    assert other.hint == "check the path and its permissions"
