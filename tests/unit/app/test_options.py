"""app/options: the root seed of a command's runs, and the options record twice run starts them
with."""

from pathlib import Path

from twice.app.options import DEFAULT_SEED, RunOptions, root_seed


def test_the_root_seed_is_the_one_given_else_the_documented_default():
    assert DEFAULT_SEED == 0  # two plain `twice run`s of a script compare equal
    assert root_seed(None) == DEFAULT_SEED and root_seed(7) == 7 and root_seed(0) == 0


def test_the_defaults_are_twice_runs_defaults_and_records_do_not_share_their_fields():
    options = RunOptions()
    assert (options.seed, options.determinism, options.trace_every) == (DEFAULT_SEED, "strict", 1)
    assert options.runs_dir == Path("runs") and not options.observe and options.portable is None
    other = RunOptions()
    other.env["X"] = "1"
    assert options.env == {}  # each record has its own dictionary
