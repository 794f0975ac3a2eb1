"""The files a process opens for reading, seen through audit hooks wherever they lie, each with
its size, mtime and inode when first opened. An audit hook stays for a process's life, so each
test watches a process of its own."""

import json
import os
import subprocess
import sys

from twice.runtime.reads import OVERFLOW, STARTED

WATCH = """
import json, os, subprocess, sys
from twice.runtime.reads import watch_reads, files_read
watch_reads(None)
data, written = sys.argv[1], sys.argv[2]
open(data, "rb").read()
os.close(os.open(data, os.O_RDONLY))  # opened again: kept as first opened
with open(written, "w") as handle:  # written, not read: no input
    handle.write("x")
import numpy  # installed packages and compiled modules: no inputs
subprocess.run(["true"])
print(json.dumps(files_read()))
"""


def test_a_file_read_is_recorded_with_its_size_time_and_inode_and_nothing_else(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(b"0123456789")
    result = subprocess.run(
        [sys.executable, "-c", WATCH, str(data), str(tmp_path / "out.txt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    info = os.stat(data)
    assert found[str(data)] == [10, info.st_mtime_ns, info.st_ino]
    inputs = [path for path in found if not path.startswith(STARTED)]
    assert inputs == [str(data)] and OVERFLOW not in found
    started = [path for path in found if path.startswith(STARTED)]
    assert len(started) == 1 and started[0].endswith("true")  # a program started is named
