"""The cost of recording a run's input files (issue 39): hashing a 1 GB dataset the first time a
run reads it, and on a later run (cached by path, size, mtime and inode), against reading it
once as a training script would, each measured side by side in one process. BENCH_INPUT_MB
changes the size (default 1024). Targets: the cached run costs next to nothing (well under 1% of
reading the file); the first run costs about one more read of the file.

The first read is from the page cache (the file was just written), as a dataset read every epoch
is; the reading pass and the hashing pass both read from memory, so the ratio is xxh3's speed
against the copy out of the page cache.
"""

import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import run_folder, size

from twice.store import inputs

SIZE = size("INPUT_MB", 1024, 2) << 20
ROUNDS = 5


def read_once(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb") as handle:
        while handle.read(1 << 22):
            pass
    return time.perf_counter() - start


def hashed(path: Path, reads: dict, cwd: str) -> float:
    start = time.perf_counter()
    (entry,) = inputs.hash_inputs(reads, cwd)
    assert entry.xxh3 is not None
    return time.perf_counter() - start


def main():
    with run_folder() as folder, tempfile.TemporaryDirectory() as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        path = Path(folder) / "train.bin"
        with open(path, "wb") as out:
            block = os.urandom(1 << 20)
            for _ in range(SIZE >> 20):
                out.write(block)
        info = path.stat()
        reads = {str(path): [info.st_size, info.st_mtime_ns, info.st_ino]}
        plain, first, cached = [], [], []
        for _ in range(ROUNDS):
            plain.append(read_once(path))
            inputs.cache_path().unlink(missing_ok=True)
            first.append(hashed(path, reads, folder))
            cached.append(hashed(path, reads, folder))
        p, f, c = (statistics.median(x) for x in (plain, first, cached))
        print(f"inputs: a {SIZE >> 20} MB file, median of {ROUNDS} rounds")
        print(f"  reading it once (what training does)      {p:8.3f} s")
        print(f"  first run: hashed (xxh3-128)              {f:8.3f} s  ({f / p:5.2f}x one read)")
        print(
            f"  later run: from the cache                 {c * 1e3:8.3f} ms ({100 * c / p:5.3f}% "
            "of one read)  (target: well under 1%)"
        )


if __name__ == "__main__":
    main()
