"""The one reader: regular files only, never a link out of the folder, bounded, strict JSON. Every
hostile form of a file (a FIFO, a link to /dev/zero, a link out of the folder, too large, nested
too deep, duplicate keys, non-finite literals) is a CorruptRecord, never a hang, a MemoryError or
a quiet value."""

import os
from pathlib import Path

import pytest

from twice.core.errors import CorruptRecord
from twice.store import reader


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _link_out(path: Path) -> None:
    outside = path.parent.parent / "outside.json"
    outside.write_text("{}")
    path.symlink_to(outside)


def _folder(path: Path) -> None:
    path.mkdir()


def _big(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(1 << 30)  # 1 GiB, sparse


HOSTILE_FILES = {"fifo": _fifo, "dev_zero": _dev_zero, "link_out": _link_out, "folder": _folder}


@pytest.mark.parametrize("form", sorted(HOSTILE_FILES))
@pytest.mark.parametrize("read", ["read_record", "read_json", "read_tail"])
def test_the_reader_refuses_what_is_not_a_regular_file(tmp_path, form, read):
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "record.json"
    HOSTILE_FILES[form](path)
    call = {
        "read_record": reader.read_record,
        "read_json": reader.read_json,
        "read_tail": reader.read_tail,
    }[read]
    with pytest.raises(CorruptRecord):
        call(path)


def test_a_file_larger_than_the_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    _big(path)
    with pytest.raises(CorruptRecord, match="larger than 256 MiB"):
        reader.read_record(path)


def test_a_subfolder_linked_out_of_the_folder_is_refused(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    outside.mkdir()
    (outside / "1.json").write_text("{}")
    (run / "procs").symlink_to(outside)
    with pytest.raises(CorruptRecord, match="out of"):
        reader.read_json(run / "procs" / "1.json", within=run)
    assert reader.read_json(outside / "1.json", within=outside) == {}


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"loss": "0x1p+0", "loss": "0x1p+1"}', "duplicate key 'loss'"),
        ('{"a": {"b": 1, "b": 1}}', "duplicate key 'b'"),
        ('{"a": NaN}', "NaN is not JSON"),
        ('{"a": Infinity}', "Infinity is not JSON"),
        ("[-Infinity]", "-Infinity is not JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ("[" * 65 + "]" * 65, "nested deeper than 64"),
        ("{this is not JSON}", "Expecting property name"),
        ("1" + "0" * 400, "too large for any record"),
        ('{"time": 1e400}', "too large for a float"),
        (b"\xff\xfe", "utf-8"),
    ],
)
def test_strict_json_refuses_what_json_would_take_or_choke_on(text, problem):
    with pytest.raises(CorruptRecord, match=problem):
        reader.loads(text, "record")


def test_strict_json_reads_what_twice_writes(tmp_path):
    from twice.store.files import write_json_atomic

    value = {"a": [1, 2.5, None, True, "x\u202e"], "b": {"c": float("nan"), "d": float("-inf")}}
    write_json_atomic(tmp_path / "r.json", value)
    assert reader.read_json(tmp_path / "r.json") == {
        "a": [1, 2.5, None, True, "x\u202e"],
        "b": {"c": "nan", "d": "-inf"},
    }


def test_a_user_input_may_be_a_link_but_never_a_fifo_or_device(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(b"abc")
    (tmp_path / "linked.bin").symlink_to(data)
    assert reader.read_input(tmp_path / "linked.bin") == b"abc"
    _fifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", Path("/dev/zero")):
        with pytest.raises(CorruptRecord):
            reader.read_input(path)


def test_the_tail_of_a_long_log_is_its_last_bytes_and_a_link_to_nothing_is_present(tmp_path):
    log = tmp_path / "stderr.log"
    log.write_bytes(b"x" * 100_000 + b"\nTraceback: the last line\n")
    assert reader.read_tail(log, limit=25) == b"Traceback: the last line\n"
    assert reader.read_tail(log) == (b"x" * 100_000 + b"\nTraceback: the last line\n")[-(1 << 16) :]
    _dev_zero(tmp_path / "trace.jsonl")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    assert reader.present(tmp_path / "trace.jsonl") and reader.present(tmp_path / "dangling")
    assert not (tmp_path / "trace.jsonl").is_file() and not reader.present(tmp_path / "nothing")
