"""No training outlives its launcher unseen: on Linux, a process started by `twice run` is killed
when the process that started it dies (`prctl(PR_SET_PDEATHSIG)`).

Without it, SIGKILL to the launcher left the training running for good, still writing its trace
and checkpoints into a run folder that `twice show` calls crashed. The launcher sets it in its
direct child (kept across exec, so it holds for any command); the bootstrap sets it again in every
Python process of the run whose parent is itself part of the run (torchrun's workers, a script's
subprocesses). Elsewhere (macOS, Windows) this is a no-op.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from twice.core.errors import Exit

__all__ = ["parent_death_hook", "die_with_parent"]

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def parent_death_hook() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen that has the child killed when this process dies (None
    where the platform cannot). Everything it calls is looked up here, before the fork."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent, kill, getppid, exit_now = os.getpid(), int(signal.SIGKILL), os.getppid, os._exit

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if getppid() != parent:  # the launcher died before the line above: die now, as asked
            exit_now(Exit.KILLED)

    return hook


def die_with_parent(parent: int) -> None:
    """In a process already running: be killed when `parent` (this process's parent now) dies;
    exit at once if it is gone already."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(Exit.KILLED)
