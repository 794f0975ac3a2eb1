"""Control characters shown as their escapes: the one function every string twice prints passes
through, in the command line (app/terminal.py) and in the user's own process alike.

Pure, so that the code running inside the training process (the bootstrap, the numerics stop)
escapes with the same function as the command line, which sits layers above it.
"""

from __future__ import annotations

import re

__all__ = ["escape_controls"]

# C0 and C1 controls but newline and tab; the line and paragraph separators; the bidirectional
# embeddings, overrides and isolates, which reorder what a reader sees.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    char = match.group()
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def escape_controls(text: str) -> str:
    """`text` with every control character (an escape sequence's ESC, a carriage return, a
    bidirectional override) written as its escape (`\\x1b`, `\\u202e`); newlines and tabs kept.

    >>> escape_controls("a\\x1b[2Jb")
    'a\\\\x1b[2Jb'
    """
    return _CONTROL.sub(_escape, text)
