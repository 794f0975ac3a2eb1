"""The exception tree of twice, each error carrying its exit code and a hint.

Any other exception reaching the command line is an internal error: exit 3 (Exit.INTERNAL).

TwiceError                 exit 2 (Exit.USAGE): usage or tool error (rendered as error:/hint:)
├── UsageError             bad arguments or options
├── RunNotFound            a run folder that does not exist or is not a run
├── CorruptRecord          a manifest or trace that cannot be read
└── DeterminismError       a determinism setting that can no longer take effect
"""

from __future__ import annotations

import errno
from enum import IntEnum


class Exit(IntEnum):
    """Every exit code twice gives, in one table (the docs' "Exit codes" list is this)."""

    SAME = 0  # runs identical, a check clean, a checkpoint valid
    DIFFER = 1  # a difference or a problem was found
    CANNOT_JUDGE = 2  # no verdict: damaged or missing records, nothing to compare
    USAGE = 2  # bad arguments or options (the same code: no verdict was given)
    INTERNAL = 3  # internal error: a bug of twice's (never 1, which is a verdict)
    NUMERICS = 4  # `twice run --numerics` stopped the run at a non-finite value
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    KILLED = 137  # killed because its launcher died (128 + SIGKILL)


EXIT_USAGE = Exit.USAGE


class TwiceError(Exception):
    """Base of every error twice raises on purpose; `hint` says how to fix it."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        # In a traceback from library use, the hint shows beside the message, as on the command
        # line.
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"

    def render(self) -> str:
        """The error as the command line prints it: `error: ...` and `hint: ...` lines."""
        lines = [f"error: {self.message}"]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


class UsageError(TwiceError):
    """Arguments or options that cannot be used as given."""


class RunNotFound(TwiceError):
    """A path that should be a run folder but is not one."""


class CorruptRecord(TwiceError):
    """A manifest, trace or other record that exists but cannot be read."""


class DeterminismError(TwiceError):
    """A determinism setting that was asked for and can no longer take effect."""


class CheckpointError(TwiceError):
    """A checkpoint that is incomplete, damaged, foreign, or does not match what is being
    restored."""


_OS_HINTS = {
    errno.ENOSPC: "free some space on that disk, or write elsewhere",
    errno.EDQUOT: "your disk quota is used up: free some space, or write elsewhere",
    errno.EROFS: "that filesystem is read-only: write elsewhere",
    errno.EACCES: "you may not write there: choose a folder you own, or fix its permissions",
    errno.EPERM: "you may not write there: choose a folder you own, or fix its permissions",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EEXIST: "a file is in the way where a folder belongs: choose another path",
    errno.EISDIR: "that path is a folder: give a file name",
    errno.ENOENT: "a folder on the path does not exist: create it first, or choose another path",
    errno.EFBIG: "the file is larger than this process may write (ulimit -f): raise the limit",
    errno.ENAMETOOLONG: "the path is too long: choose a shorter one",
}


def from_os_error(exc: OSError, doing: str) -> TwiceError:
    """A failed read or write as a TwiceError: what was being done, the system's reason, the path,
    and a hint for the usual causes."""
    where = f" ({exc.filename})" if exc.filename else ""
    return UsageError(
        f"cannot {doing}: {exc.strerror or exc}{where}",
        _OS_HINTS.get(exc.errno or 0, "check the path and its permissions"),
    )
