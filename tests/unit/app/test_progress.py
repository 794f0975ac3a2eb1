"""app/progress: what a long command is doing, as lines on stderr where it is not a terminal."""

import io

from twice.app import progress
from twice.app.progress import Reporter
from twice.core.records import record_line
from twice.store.layout import RunFolder
from unit.app.folders import steps


def test_off_a_terminal_each_event_is_one_line_naming_the_command(tmp_path):
    stream = io.StringIO()
    run = tmp_path / "run"
    run.mkdir()
    with Reporter("verify", stream=stream) as reporter:
        assert progress.active() is reporter
        progress.run_started(run, "verify of a", 3)
        RunFolder(run).trace().write_bytes(b"".join(record_line(r) for r in steps([1.0, 0.5])))
        progress.run_ended(run, 1)
        reporter.count("trials", "trials", 1, 4)
        reporter.count("trials", "trials", 1, 4)  # unchanged: no line
        reporter.event("a note\x1b[2J")
    assert progress.active() is None
    lines = stream.getvalue().splitlines()
    assert lines[0] == "twice verify: verify of a started (3 steps)"
    assert lines[1].startswith("twice verify: verify of a ended: 2 steps in ")
    assert lines[1].endswith(" s, exit 1")
    assert lines[2:] == ["twice verify: trials: 1/4", "twice verify: a note\\x1b[2J"]


def test_a_quiet_reporter_says_nothing_and_no_reporter_is_no_error(tmp_path):
    stream = io.StringIO()
    with Reporter("sweep", quiet=True, stream=stream) as reporter:
        reporter.event("hidden")
        reporter.count("k", "trials", 1, 2)
    assert stream.getvalue() == ""
    progress.run_started(tmp_path, None, None)  # outside a command: nothing to tell
    progress.run_ended(tmp_path, 0)
