"""Re-running what a run folder says: only what this user recorded on this machine runs unasked.

`twice verify`, `verify --resume-at`, `locate` and `bisect` execute the command in a manifest. A
run folder can come from anyone (a colleague, a cluster, an artifact store), so a folder that was
not recorded by this user on this machine shows its command and needs `--yes`. Of its recorded
environment only the variables that change numerics are applied again (the allow-list in
runtime/capture.py): never `BASH_ENV`, `LD_PRELOAD`, `PYTHONSTARTUP` and the like.
"""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path

from twice.core.errors import UsageError
from twice.core.manifest import Manifest
from twice.runtime.capture import numeric_env
from twice.store.layout import RunFolder

__all__ = ["UntrustedRun", "foreign_reason", "require_trust", "replayable_env"]


class UntrustedRun(UsageError):
    """A run folder from elsewhere whose command was not confirmed with --yes."""


def foreign_reason(run_dir: Path, manifest: Manifest) -> str | None:
    """Why `run_dir` was not recorded by this user on this machine, or None when it was."""
    host = manifest.launcher.get("host") if isinstance(manifest.launcher, dict) else None
    if host != socket.gethostname():
        return f"it was recorded on {host!r}, not on this machine" if host else "it names no host"
    try:
        owner = RunFolder(run_dir).manifest.stat().st_uid
    except OSError:
        return "its manifest cannot be examined"
    if hasattr(os, "getuid") and owner != os.getuid():
        return "its manifest belongs to another user"
    return None


def require_trust(run_dir: Path, manifest: Manifest, yes: bool) -> None:
    """Refuse to re-run a foreign folder's command unless `yes` (the user saw it and agreed)."""
    reason = None if yes else foreign_reason(run_dir, manifest)
    if reason is None:
        return
    command = shlex.join(str(part) for part in manifest.argv)
    raise UntrustedRun(
        f"not re-running the command of {run_dir}: {reason}; it would run: {command}",
        "check the command, then pass --yes to run it",
    )


def replayable_env(recorded: dict) -> dict[str, str]:
    """The recorded environment a re-run applies: numerics variables only, as strings."""
    return {k: v for k, v in numeric_env(recorded).items() if isinstance(v, str)}
