"""The premise "same input files", from what two runs' records cover of the files they read."""

from twice.core.coverage import InputPremise, code_names, judge_inputs
from twice.core.manifest import Difference, Manifest, compare_identity


def _manifest(files, cwd="/work", **coverage):
    """A manifest whose run read `files` ({path: digest, or (size, mtime) for one not hashed})."""
    identity, entries = {}, []
    for path, value in files.items():
        if isinstance(value, tuple):
            identity[path] = "not hashed: over the budget"
            entries.append({"path": path, "size": value[0], "mtime_ns": value[1], "xxh3": None})
        else:
            identity[path] = value
            entries.append({"path": path, "size": 10, "mtime_ns": 1, "xxh3": value})
    context = {
        "cwd": cwd,
        "inputs": entries,
        "inputs_coverage": {"scope": "everywhere", **coverage},
    }
    return Manifest({"argv": ["python"], "inputs": identity}, context)


def _judge(a, b):
    return judge_inputs(a, b, compare_identity(a.identity, b.identity))


def test_the_same_files_with_the_same_digests_are_a_complete_premise():
    a = _manifest({"/work/data.bin": "aa", "/work/labels.txt": "bb"})
    kept, premise = _judge(a, a)
    assert kept == [] and premise.complete and premise.clause() is None and premise.unknown() == ""


def test_a_file_that_differs_is_named_relative_to_the_working_folder():
    a = _manifest({"/work/data.bin": "aa", "/work/labels.txt": "bb"})
    b = _manifest({"/work/data.bin": "ab", "/work/labels.txt": "bb"})
    kept, premise = _judge(a, b)
    assert [d.key for d in kept] == ["inputs./work/data.bin"]
    assert premise.differing == ("data.bin differs",)
    assert premise.clause() == "the runs read different data: data.bin differs"


def test_a_file_read_by_one_run_only_is_named_with_that_run():
    a = _manifest({"/work/data.bin": "aa"})
    b = _manifest({"/work/data.bin": "aa", "/work/extra.bin": "cc"})
    _, premise = _judge(a, b)
    assert premise.differing == ("extra.bin was read by B only",)


def test_more_than_three_files_are_counted_not_listed():
    a = _manifest({f"/work/part{i}": "aa" for i in range(5)})
    b = _manifest({f"/work/part{i}": "bb" for i in range(5)})
    clause = _judge(a, b)[1].clause()
    assert clause.endswith("part0 differs, part1 differs, part2 differs and 2 more")


def test_a_file_hashed_in_one_run_and_equal_by_size_and_time_in_the_other_is_a_gap_not_a_cause():
    a = _manifest({"/data/train": "aa"})
    a.context["inputs"][0].update(size=100, mtime_ns=7)
    b = _manifest({"/data/train": (100, 7)})
    kept, premise = _judge(a, b)
    assert kept == [] and not premise.complete and premise.clause() is None
    assert premise.unknown().startswith(
        "1 file read outside the working folder was compared by size and time only"
    )
    changed = _manifest({"/data/train": (101, 8)})
    _, premise = _judge(a, changed)
    assert premise.by_time_differs
    assert premise.clause() == (
        "the runs read different data: 1 file read outside the working folder was compared by "
        "size and time only; ../data/train differs in size or modification time"
    )


def test_what_no_record_covers_is_said():
    a = _manifest({"/work/x": "aa"}, stdin_pipe=True, not_python=["curl"])
    b = _manifest({"/work/x": "aa"}, unrecorded=True, unwatched_python=["python3"])
    gaps = _judge(a, b)[1].gaps
    assert gaps[0].startswith("standard input was a pipe in A")
    assert "a process that is not Python (curl)" in gaps[1]
    assert "a process of Python started without twice's settings (python3)" in gaps[2]
    assert gaps[3].startswith("a process read more than 100,000 files")


def test_runs_that_did_not_record_their_inputs_keep_every_difference():
    plain = Manifest({"argv": ["python"]}, {})
    diffs = [Difference("arguments", "argv", ["a"], ["b"])]
    kept, premise = judge_inputs(plain, plain, diffs)
    assert kept == diffs and premise == InputPremise(False) and not premise.complete


def test_code_names_put_files_read_as_data_first_then_sources_then_git_facts():
    keys = [
        "code.git.commit",
        "code.sources.model.py",
        "code.read_as_data.cfg.py",
        "code.git.dirty",
    ]
    assert code_names(keys) == [
        "cfg.py, read as data",
        "model.py",
        "code.git.commit",
        "code.git.dirty",
    ]
