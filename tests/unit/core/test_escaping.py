"""escape_controls: what a terminal would obey is shown as its escape, the rest is kept."""

import pytest

from twice.core.escaping import escape_controls


@pytest.mark.parametrize(
    "text, shown",
    [
        ("a\x1b[2Jb", "a\\x1b[2Jb"),  # an escape sequence that would clear the screen
        ("loss\rfake", "loss\\x0dfake"),  # a carriage return overwrites
        ("\x00\x7f\x85\x9f", "\\x00\\x7f\\x85\\x9f"),  # NUL, DEL and the C1 controls
        ("run\u202egpj.exe", "run\\u202egpj.exe"),  # a bidirectional override reorders
        ("a\u2028b\u2066c", "a\\u2028b\\u2066c"),  # a line separator, an isolate
    ],
)
def test_controls_are_written_as_their_escapes(text, shown):
    assert escape_controls(text) == shown


def test_newlines_tabs_and_printable_text_of_any_script_are_kept():
    text = "step 3\tloss 0.5\nété 中文 ∑ \\x1b already escaped"
    assert escape_controls(text) == text


def test_escaping_twice_shows_the_same_as_escaping_once():
    once = escape_controls("\x1b]8;;http://x\x07link\x1b]8;;\x07")
    assert "\x1b" not in once and "\x07" not in once
    assert escape_controls(once) == once
