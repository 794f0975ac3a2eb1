"""The script's own seeding calls of two runs, compared and told in words."""

from twice.core.seedcalls import SEEDED, seeding_difference

WATCHED = sorted(SEEDED)


def _calls(*calls):
    return {
        "calls": [dict(zip(("api", "site", "values", "calls", "entropy"), c)) for c in calls],
        "watched": WATCHED,
    }


def test_the_same_seeding_in_both_runs_is_no_difference():
    a = _calls(("torch.manual_seed", "train.py:3", "aa", 1, 0))
    assert seeding_difference(a, a) is None


def test_a_seed_that_changes_between_runs_is_named_with_its_line():
    a = _calls(("torch.manual_seed", "train.py:3", "aa", 1, 0))
    b = _calls(("torch.manual_seed", "train.py:3", "bb", 1, 0))
    assert seeding_difference(a, b) == (
        "the script seeds torch itself at train.py:3, with another value in each run"
    )


def test_seeding_from_os_entropy_is_named_as_such():
    a = _calls(("numpy.random.default_rng", "data.py:9", None, 1, 1))
    assert seeding_difference(a, a) == (
        "the script seeds a NumPy Generator from OS entropy at data.py:9 "
        "(`numpy.random.default_rng` without a seed), with another value in each run"
    )


def test_a_call_in_one_run_only_counts_where_the_other_watched_that_api():
    a = _calls(("random.seed", "train.py:1", "aa", 1, 0))
    b = _calls()
    assert (
        seeding_difference(a, b) == "the script seeds Python's random at train.py:1 in run A only"
    )
    b["watched"] = ["torch.manual_seed"]  # an older twice, not watching random.seed
    assert seeding_difference(a, b) is None


def test_values_that_change_every_run_come_first_and_the_rest_are_counted():
    a = _calls(
        ("random.seed", "train.py:2", "aa", 1, 0),
        ("torch.manual_seed", "train.py:10", "aa", 1, 0),
        ("torch.cuda.manual_seed", "train.py:9", "aa", 1, 0),
    )
    b = _calls(
        ("torch.manual_seed", "train.py:10", "bb", 1, 0),
        ("torch.cuda.manual_seed", "train.py:9", "aa", 2, 0),
    )
    assert seeding_difference(a, b) == (
        "the script seeds CUDA itself at train.py:9, with another value in each run "
        "(2 more seeding calls differ)"
    )


def test_a_run_without_a_record_of_its_seeding_compares_as_unknown():
    assert seeding_difference(None, _calls()) is None
    assert seeding_difference(_calls(), "damaged") is None


def test_scripts_of_different_names_compare_their_calls_line_by_line():
    """A script renamed (or a copy run) is the same code line by line: its seeding is no
    difference, a changed value at its line still is, and other files are not renamed."""
    a = _calls(
        ("torch.manual_seed", "train.py:2", "aa", 1, 0), ("random.seed", "lib.py:4", "cc", 1, 0)
    )
    b = _calls(
        ("torch.manual_seed", "copy.py:2", "aa", 1, 0), ("random.seed", "lib.py:4", "cc", 1, 0)
    )
    scripts = ("train.py", "copy.py")
    assert seeding_difference(a, b, scripts) is None
    assert seeding_difference(a, b) is not None  # unknown scripts: two different sites
    changed = _calls(
        ("torch.manual_seed", "copy.py:2", "bb", 1, 0), ("random.seed", "lib.py:4", "cc", 1, 0)
    )
    assert seeding_difference(a, changed, scripts) == (
        "the script seeds torch itself at train.py:2, with another value in each run"
    )
    moved = _calls(
        ("torch.manual_seed", "copy.py:3", "aa", 1, 0), ("random.seed", "lib.py:4", "cc", 1, 0)
    )
    assert "train.py:2 in run A only" in seeding_difference(a, moved, scripts)


def test_a_file_named_as_the_other_runs_script_keeps_its_own_calls():
    """Run A ran common.py; run B ran train.py, which imports its own common.py: B's script's
    line 2 matches A's script's line 2, and B's common.py keeps its own call, a difference."""
    a = _calls(("torch.manual_seed", "common.py:2", "v0", 1, 0))
    b = _calls(
        ("torch.manual_seed", "train.py:2", "v0", 1, 0),
        ("torch.manual_seed", "common.py:2", "v1", 1, 0),
    )
    said = seeding_difference(a, b, ("common.py", "train.py"))
    assert said == "the script seeds torch at common.py:2 in run B only"
    two = _calls(("random.seed", "x.py:1", "a", 1, 0), ("random.seed", "y.py:1", "a", 1, 0))
    assert seeding_difference(two, _calls()).endswith("(1 more seeding call differs)")
