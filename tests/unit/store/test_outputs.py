"""The files a command wrote in its working folder: found by modification time outside the
skipped folders, named by digest, compared between two runs and told in words."""

import os
import time

import xxhash

from twice.store.outputs import compare_outputs, outputs_phrase, written_files


def test_files_written_since_the_start_are_listed_by_size_and_digest(tmp_path):
    old = tmp_path / "data.csv"
    old.write_text("old")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    started = time.time()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.bin").write_bytes(b"weights")
    for skipped in (".git", "__pycache__", "runs"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "x").write_bytes(b"not an output")
    (tmp_path / "link").symlink_to(tmp_path / "out" / "model.bin")
    found = written_files(tmp_path, started, [tmp_path / "runs"])
    assert found == {"out/model.bin": {"size": 7, "xxh3": xxhash.xxh3_128(b"weights").hexdigest()}}


def test_two_runs_outputs_are_identical_different_or_one_sided():
    a = {
        "same.pt": {"size": 3, "xxh3": "aa"},
        "grown.pt": {"size": 3, "xxh3": "bb"},
        "ckpt/.metadata": {"size": 9, "xxh3": "m1", "dcp_state": "s"},
        "a.log": {"size": 1, "xxh3": "cc"},
        "huge.bin": {"size": 2**31},  # listed by size only: never called identical
    }
    b = {
        "same.pt": {"size": 3, "xxh3": "aa"},
        "grown.pt": {"size": 4, "xxh3": "bd"},
        "ckpt/.metadata": {"size": 9, "xxh3": "m2", "dcp_state": "s"},
        "b.log": {"size": 1, "xxh3": "cc"},
        "huge.bin": {"size": 2**31},
    }
    found = compare_outputs(a, b)
    assert found == {
        "identical": ["same.pt"],
        "dcp_save_id": ["ckpt/.metadata"],
        "differ": ["grown.pt", "huge.bin"],
        "only_a": ["a.log"],
        "only_b": ["b.log"],
    }
    assert outputs_phrase(found) == (
        "files the runs wrote: 1 byte-identical, 1 DCP metadata differ only in the random save id"
        " and folder DCP records at each save (ckpt/.metadata), 2 differ (grown.pt, huge.bin),"
        " 1 written by A only (a.log), 1 written by B only (b.log)"
    )
    assert outputs_phrase(compare_outputs(None, {})) == "files the runs wrote: none recorded"
