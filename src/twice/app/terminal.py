"""What reaches the terminal: every string a command prints, made safe (control characters
escaped), since records hold strings from anywhere."""

from __future__ import annotations

import re

__all__ = ["printable"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def printable(text: str, color: bool = False) -> str:
    """`text` safe for a terminal: every control character (an escape sequence's ESC, a carriage
    return, a bidirectional override) shown as its escape (`\\x1b`), except newlines and tabs,
    and, where `color` is on, the colour sequences twice's own styling writes. Records hold
    strings from anywhere (an argv, a tensor's name), and every line the command line prints
    passes through here (cli/group.py), so none reaches the terminal raw."""

    def escape(match: re.Match) -> str:
        char = match.group()
        return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"

    if not color:
        return _CONTROL.sub(escape, text)
    pieces, at = [], 0
    for match in _SGR.finditer(text):
        pieces += [_CONTROL.sub(escape, text[at : match.start()]), match.group()]
        at = match.end()
    pieces.append(_CONTROL.sub(escape, text[at:]))
    return "".join(pieces)
