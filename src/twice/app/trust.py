"""Re-running what a run folder says: only what this user's twice signed runs unasked.

`twice verify`, `verify --resume-at`, `locate` and `bisect` execute the command in a manifest. A
run folder can come from anyone (a colleague, a cluster, an artifact store), and everything in it
can be forged: its host, its owner (copying a folder makes you its owner), any field. What a
folder cannot forge is a signature made with a key it never saw: as Jupyter signs notebooks,
twice keeps a secret key per user (created on first use, mode 0600, in
`$XDG_CONFIG_HOME/twice/key`, else `~/.config/twice/key`) and signs, with an HMAC-SHA256, what a
re-run executes (the command, the working folder, the recorded environment) in every manifest
it writes. A folder without a valid signature shows its command and needs a terminal
confirmation or `--yes`. Of its recorded environment only an allow-list of exact names with
validated values is applied again (REPLAYED): never `BASH_ENV`, `LD_PRELOAD`,
`CUDA_INJECTION64_PATH`, `NCCL_NET_PLUGIN` and the like.

The check is the one door to a re-run: `admit` turns the manifest it judged (read once) into a
frozen `Rerun`, the only thing app/rerun.py starts. Nothing re-reads manifest.json after the check,
so a file swapped between the check (or the user's answer) and the start changes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import shlex
import stat
from collections.abc import Callable
from dataclasses import InitVar, dataclass
from pathlib import Path

from twice.core.errors import CorruptRecord, UsageError
from twice.core.manifest import Manifest
from twice.store import reader
from twice.store.runs import read_manifest

__all__ = [
    "UntrustedRun",
    "Rerun",
    "admit",
    "trusted_rerun",
    "foreign_reason",
    "replayable_env",
    "sign_manifest",
    "key_path",
    "REPLAYED",
]

# The variables a re-run applies from a recorded environment, each with the values it may take:
# thread counts, hashing, BLAS and cuBLAS/cuDNN/NCCL numerics switches. Nothing that names a file,
# a library or a plugin.
_COUNT = r"[1-9][0-9]{0,5}"
_SWITCH = r"[01]"
REPLAYED = {
    "PYTHONHASHSEED": r"random|[0-9]{1,10}",
    "OMP_NUM_THREADS": _COUNT,
    "MKL_NUM_THREADS": _COUNT,
    "OPENBLAS_NUM_THREADS": _COUNT,
    "VECLIB_MAXIMUM_THREADS": _COUNT,
    "NUMEXPR_NUM_THREADS": _COUNT,
    "MKL_CBWR": r"[A-Z0-9_,]{1,40}",
    "MKL_ENABLE_INSTRUCTIONS": r"[A-Z0-9_]{1,20}",
    "ATEN_CPU_CAPABILITY": r"default|avx2|avx512|avx512_vnni|avx512_bf16|sve256|zvector",
    "CUBLAS_WORKSPACE_CONFIG": r":[0-9]{1,6}:[0-9]{1,6}(,:[0-9]{1,6}:[0-9]{1,6})*",
    "NVIDIA_TF32_OVERRIDE": _SWITCH,
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": _SWITCH,
    "CUDA_LAUNCH_BLOCKING": _SWITCH,
    "CUDNN_DETERMINISTIC": _SWITCH,
    "NCCL_ALGO": r"[A-Za-z,]{1,40}",
    "NCCL_PROTO": r"[A-Za-z,]{1,40}",
    "KMP_DETERMINISTIC_REDUCTION": r"true|false|[01]",
}


class UntrustedRun(UsageError):
    """A run folder from elsewhere whose command was not confirmed with --yes."""


def key_path() -> Path:
    """Where this user's signing key lives."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "twice" / "key"


def _user_key(create: bool) -> bytes | None:
    """This user's key: created on first use (mode 0600), None where it cannot be had. A key
    others may read signs nothing."""
    path = key_path()
    try:
        handle = reader.open_record(path)  # a regular file, not a link, FIFO or device
    except CorruptRecord:
        return None
    except FileNotFoundError:
        if not create:
            return None
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: read that one
            return _user_key(False)
        except OSError:
            return None
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        return _user_key(False)
    except OSError:
        return None
    with handle:
        info = os.fstat(handle.fileno())
        key = handle.read(129).strip()
    owned = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    private = stat.S_ISREG(info.st_mode) and not info.st_mode & 0o077
    return key if owned and private and len(key) >= 32 else None


def _signed_part(manifest: dict) -> bytes:
    """What a re-run executes, as canonical bytes: the command, its folder, its environment."""
    identity, context = manifest.get("identity", {}), manifest.get("context", {})
    part = {"argv": identity.get("argv"), "cwd": context.get("cwd"), "env": identity.get("env")}
    return json.dumps(part, sort_keys=True, separators=(",", ":")).encode()


def _signature(key: bytes, manifest: dict) -> str:
    return hmac.new(key, _signed_part(manifest), hashlib.sha256).hexdigest()


def sign_manifest(manifest: dict) -> dict:
    """`manifest` with this user's signature in `context.signature` (unsigned where no key can be
    had: a re-run then asks first). Every manifest twice writes passes through here."""
    key = _user_key(create=True)
    context = manifest.setdefault("context", {})
    if key is None:
        context.pop("signature", None)
    else:
        context["signature"] = _signature(key, manifest)
    return manifest


def foreign_reason(run_dir: Path, manifest: Manifest) -> str | None:
    """Why `run_dir`'s command was not signed by this user's twice, or None when it was."""
    signature = manifest.context.get("signature")
    if not isinstance(signature, str):
        return "it carries no signature (recorded by another user or elsewhere, or edited)"
    key = _user_key(create=False)
    if key is None:
        return f"this user has no signing key ({key_path()})"
    if not hmac.compare_digest(signature, _signature(key, manifest.to_json())):
        return (
            "its signature is not this user's (recorded by another user or elsewhere, or its "
            "command, folder or environment was edited)"
        )
    return None


# Made only by `admit`: a Rerun built elsewhere (or by dataclasses.replace) lacks it.
_ADMITTED = object()


@dataclass(frozen=True)
class Rerun:
    """What a re-run of `run_dir` executes, from the one manifest the trust check judged: its
    command, folder and replayable environment, and the settings it was recorded with. Frozen,
    and made only by `admit`."""

    run_dir: Path
    argv: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]  # the replayable part of the recorded environment, sorted
    seed: int
    determinism: str
    observe: bool
    portable: bool
    trace_every: int
    params_every: int | None
    full_every: int | None
    steps: int | None
    door: InitVar[object]

    def __post_init__(self, door: object) -> None:
        if door is not _ADMITTED:
            raise TypeError("a Rerun is made by the trust check only (app/trust.py: admit)")


# Consent to a re-run: True (--yes), False (only what this user signed), or a question that is
# shown the command and answers whether to run it.
Consent = bool | Callable[[str], bool]


def admit(run_dir: Path, manifest: Manifest, yes: Consent = False) -> Rerun:
    """The trust check: `manifest`, read once from `run_dir`, as the Rerun to execute, when this
    user's twice signed it or `yes` allows it (True, or a question answered yes); else
    UntrustedRun. What was judged (and shown) is what runs: nothing is read again."""
    asked = callable(yes)
    reason = None if yes and not asked else foreign_reason(run_dir, manifest)
    if reason is not None:
        command = shlex.join(str(part) for part in manifest.argv)
        refusal = UntrustedRun(
            f"not re-running the command of {run_dir}: {reason}; it would run: {command}",
            "check the command, then pass --yes to run it",
        )
        if not asked or not yes(refusal.message):
            raise refusal
    return Rerun(
        run_dir=Path(run_dir),
        argv=tuple(str(part) for part in manifest.argv),
        cwd=str(manifest.cwd),
        env=tuple(sorted(replayable_env(manifest.env).items())),
        seed=manifest.seed if manifest.seed is not None else 0,
        determinism=manifest.determinism,
        observe=manifest.observe,
        portable=manifest.portable,
        trace_every=manifest.trace_every,
        params_every=manifest.params_every,
        full_every=manifest.full_every,
        steps=manifest.steps,
        door=_ADMITTED,
    )


def trusted_rerun(run_dir: Path, yes: Consent = False) -> Rerun:
    """`run_dir`'s manifest, read once by the validated reader, through `admit`."""
    return admit(Path(run_dir), read_manifest(run_dir), yes)


def replayable_env(recorded: dict) -> dict[str, str]:
    """The recorded environment a re-run applies: the names in REPLAYED, each only with a value
    its pattern allows; anything else is left out."""
    return {
        name: value
        for name, value in recorded.items()
        if name in REPLAYED and isinstance(value, str) and re.fullmatch(REPLAYED[name], value)
    }
