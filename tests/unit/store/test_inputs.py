"""The files a run read, hashed within a budget and cached: what is hashed, what is compared by
size and time, what the run made or lost, and a large file hashed from a mapping in a process of
its own."""

import json
import os
import time
from pathlib import Path

import numpy as np

from twice.core.causes import explain
from twice.core.coverage import judge_inputs
from twice.core.divergence import Divergence
from twice.core.manifest import Manifest, compare_identity
from twice.store import inputs as inputs_module
from twice.store.inputs import hash_inputs


def test_a_file_is_hashed_once_then_taken_from_the_cache(tmp_path, monkeypatch):
    """Outside the working and --inputs folders only; a rewrite that keeps the inode, size and
    mtime (`cp -p`, `rsync --inplace -t`, `touch -r`) changes the ctime, which is in the key."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 5000)
    info = path.stat()
    reads = {str(path): [info.st_size, info.st_mtime_ns, info.st_ino]}
    work = [str(tmp_path / "work")]
    (first,) = hash_inputs(reads, str(tmp_path), roots=work)
    cache = json.loads(inputs_module.cache_path().read_text())
    (key,) = cache
    cache[key] = ["c" * 32, False]  # what the cache says is what a second run takes
    inputs_module.cache_path().write_text(json.dumps(cache))
    (second,) = hash_inputs(reads, str(tmp_path), roots=work)
    assert first.xxh3 != "c" * 32 and second.xxh3 == "c" * 32
    (inside,) = hash_inputs(reads, str(tmp_path), roots=[str(tmp_path)])
    assert inside.xxh3 == first.xxh3  # under the folders: always hashed, never the cache's
    time.sleep(0.01)
    with open(path, "r+b") as handle:  # in place: the same inode and size
        handle.write(b"z")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))  # the mtime put back: touch -r
    now = path.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (
        info.st_ino,
        info.st_size,
        info.st_mtime_ns,
    )
    assert now.st_ctime_ns != info.st_ctime_ns
    (rewritten,) = hash_inputs(reads, str(tmp_path), roots=work)
    assert rewritten.xxh3 not in (first.xxh3, "c" * 32)
    monkeypatch.setattr(inputs_module, "SAMPLE_ABOVE", 1000)
    monkeypatch.setattr(inputs_module, "BLOCK", 100)
    path.write_bytes(b"y" * 5000)
    info = path.stat()
    (sampled,) = hash_inputs(
        {str(path): [info.st_size, info.st_mtime_ns, info.st_ino]}, str(tmp_path)
    )
    assert sampled.sampled and sampled.to_json()["sampled"] is True


def test_a_file_the_run_rewrote_is_listed_as_changed_without_a_digest(tmp_path):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    info = path.stat()
    reads = {str(path): [info.st_size, info.st_mtime_ns, info.st_ino]}
    path.write_bytes(b"newer")
    (entry,) = hash_inputs(reads, str(tmp_path))
    assert entry.changed and entry.xxh3 is None


def _reads(*paths):
    found = {}
    for path in paths:
        info = path.stat()
        found[str(path)] = [info.st_size, info.st_mtime_ns, info.st_ino]
    return found


def test_files_outside_the_folders_are_hashed_within_the_budget_then_by_size_and_time(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir(), data.mkdir()
    (work / "in.bin").write_bytes(b"i" * 2000)
    (data / "small.bin").write_bytes(b"s" * 10)
    (data / "big.bin").write_bytes(b"b" * 1000)
    reads = _reads(work / "in.bin", data / "small.bin", data / "big.bin")

    def record(budget):
        files = hash_inputs(reads, str(work), roots=[str(work)], budget=budget)
        return {Path(f.path).name: f for f in files}

    files = record(100)  # smallest first: small.bin fits, big.bin does not
    assert files["in.bin"].xxh3 and not files["in.bin"].outside  # always hashed in the folder
    assert files["small.bin"].xxh3 and files["small.bin"].outside
    big = files["big.bin"]
    assert big.xxh3 is None and big.not_hashed == "over the budget"
    assert big.to_json()["not_hashed"] == "over the budget" and big.to_json()["inode"] > 0
    assert big.identity() == f"not hashed: 1000 bytes, mtime_ns {big.mtime_ns}"
    assert record(1 << 20)["big.bin"].xxh3  # within a larger budget
    assert record(0)["big.bin"].xxh3  # a digest in the cache costs nothing against the budget
    device = (data / "big.bin").stat().st_dev
    cache = json.loads(inputs_module.cache_path().read_text())
    assert any(f"|{device}|" in key and "big.bin" in key for key in cache)  # keyed by the device
    summary = inputs_module.coverage(list(record(0).values()))
    assert summary["scope"] == "everywhere" and summary["outside"] == 2


def test_a_file_written_after_the_run_started_is_its_product_not_an_input(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    started = time.time() - 1
    (tmp_path / "made.tmp").write_bytes(b"written by the run")
    (entry,) = hash_inputs(_reads(tmp_path / "made.tmp"), str(tmp_path), started=started)
    assert entry.made_by_run and entry.xxh3 is None and entry.identity() == "made by the run"
    future = tmp_path / "skewed.bin"  # clock skew, a tar from another machine: an input
    future.write_bytes(b"data")
    os.utime(future, (time.time() + 86400, time.time() + 86400))
    (entry,) = hash_inputs(_reads(future), str(tmp_path), started=started)
    assert not entry.made_by_run and entry.xxh3 and inputs_module.coverage([entry])["files"] == 1


def test_a_file_read_and_gone_by_the_runs_end_is_kept_as_not_compared(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "inbox.f32"
    path.write_bytes(b"data")
    reads = _reads(path)
    path.unlink()
    (entry,) = hash_inputs(reads, str(tmp_path), started=time.time())
    assert entry.gone and entry.xxh3 is None and entry.size == 4 and entry.inode > 0
    assert entry.to_json()["gone"] is True and inputs_module.coverage([entry])["gone"] == 1


def _manifest(files, cwd):
    identity = {"inputs": {f.path: f.identity() for f in files}}
    context = {
        "cwd": cwd,
        "inputs": [f.to_json() for f in files],
        "inputs_coverage": inputs_module.coverage(files),
    }
    return Manifest(identity, context)


def test_a_file_compared_by_size_and_time_is_named_with_what_was_not_covered(tmp_path, monkeypatch):
    """A file one run could not hash is compared by size and time: equal, it takes "same input
    files" away (the sentence says what was not covered); different, it is the cause, and the
    sentence says how far the comparison reached. Never nondeterminism."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir(), data.mkdir()
    path = data / "train-images"
    path.write_bytes(b"x" * 100)

    def record(budget):
        files = hash_inputs(_reads(path), str(work), roots=[str(work)], budget=budget)
        return _manifest(files, str(work))

    hashed, unhashed = record(1000), record(0)
    inputs_module.cache_path().unlink()
    unhashed = record(0)  # not in the cache now: over the budget
    diffs = compare_identity(hashed.identity, unhashed.identity)
    kept, premise = judge_inputs(hashed, unhashed, diffs)
    assert len(diffs) == 1 and kept == [] and not premise.complete  # equal as far as known
    divergence = Divergence("main", 3, ["grads"])
    sentence = explain(kept, divergence, inputs=premise)
    assert "1 file read outside the working folder was compared by size and time only" in sentence
    assert "nondeterminism" not in sentence

    path.write_bytes(b"y" * 101)  # another size (and time)
    changed = record(0)
    diffs = compare_identity(hashed.identity, changed.identity)
    kept, premise = judge_inputs(hashed, changed, diffs)
    assert premise.clause() == (
        "the runs read different data: 1 file read outside the working folder was compared by "
        "size and time only; ../data/train-images differs in size or modification time"
    )
    assert premise.clause() in explain(kept, divergence, inputs=premise)


def test_a_large_file_is_hashed_in_the_process_to_the_digest_of_its_bytes(tmp_path, monkeypatch):
    """A large file is hashed from a mapping in a new process (exec'd, never a fork of this
    process, whose threads can deadlock a forked child; a SIGBUS from a truncated mapping ends
    that process only), to the digest its bytes have; what that process does not report is
    hashed by reading, in this one."""
    import xxhash

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(inputs_module, "MAP_ABOVE", 1000)
    data = np.random.default_rng(0).bytes(3 << 20)
    big = tmp_path / "big.bin"
    big.write_bytes(data)
    expected = xxhash.xxh3_128(data).hexdigest()
    assert inputs_module._mapped_digests([(str(big), len(data))]) == {str(big): expected}
    (entry,) = hash_inputs(_reads(big), str(tmp_path))
    assert entry.xxh3 == expected
    # a size that no longer matches (the file changed): not reported, so hashed by reading
    assert inputs_module._mapped_digests([(str(big), len(data) + 1)]) == {}
    monkeypatch.setattr(inputs_module, "_MAPPED_HASHER", "import os; os.kill(os.getpid(), 7)")
    assert inputs_module._mapped_digests([(str(big), len(data))]) == {}  # died: SIGBUS
    (entry,) = hash_inputs(_reads(big), str(tmp_path))
    assert entry.xxh3 == expected
