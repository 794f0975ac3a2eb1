"""The cost of recording a run's input files (issues 39 and 51): a 1 GB dataset lying outside the
working folder (as most datasets do: ../data), hashed the first time a run reads it (within the
budget for files outside the working and --inputs folders) and taken from the cache on a later
run (keyed by path, device, inode, size and mtime), against reading it once as a training script
would, each measured side by side in one process. BENCH_INPUT_MB changes the size (default
1024); the file is made in a temporary folder (BENCH_DIR, else the system's) and deleted after.

Targets: the first run's recording costs at most 1.05x one read of the file; a cached run at most
1% of one read.

The file is read from the page cache (it was just written), as a dataset read every epoch is;
the reading pass and the hashing pass both read from memory, so the ratio is xxh3's speed against
the copy out of the page cache (hashing reads into one buffer, refilled while it is in the CPU's
cache).
"""

import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import size

from twice.store import inputs

SIZE = size("INPUT_MB", 1024, 2) << 20
ROUNDS = 5


def read_once(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb") as handle:
        while handle.read(1 << 22):
            pass
    return time.perf_counter() - start


def hashed(path: Path, reads: dict, work: str) -> float:
    start = time.perf_counter()
    (entry,) = inputs.hash_inputs(reads, work, roots=[work])
    assert entry.xxh3 is not None and entry.outside, "the file must be hashed, within the budget"
    return time.perf_counter() - start


def main():
    base = os.environ.get("BENCH_DIR") or None
    with tempfile.TemporaryDirectory(dir=base, prefix="twice-bench-inputs-") as folder:
        os.environ["XDG_CACHE_HOME"] = str(Path(folder) / "cache")
        work, data = Path(folder) / "work", Path(folder) / "data"
        work.mkdir(), data.mkdir()
        path = data / "train.bin"  # outside the working folder: ../data/train.bin
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
            first.append(hashed(path, reads, str(work)))
            cached.append(hashed(path, reads, str(work)))
        p, f, c = (statistics.median(x) for x in (plain, first, cached))
        print(
            f"inputs: a {SIZE >> 20} MB file outside the working folder, median of {ROUNDS} rounds"
        )
        print(f"  reading it once (what training does)      {p:8.3f} s")
        print(
            f"  first run: hashed (xxh3-128)              {f:8.3f} s  ({f / p:5.2f}x one read)"
            "  (target: <= 1.05x)"
        )
        print(
            f"  later run: from the cache                 {c * 1e3:8.3f} ms ({100 * c / p:5.3f}% "
            "of one read)  (target: <= 1%)"
        )


if __name__ == "__main__":
    main()
