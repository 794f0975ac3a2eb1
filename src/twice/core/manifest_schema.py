"""The manifest's schema: every field twice reads or writes, with the check its value must pass
(pure; core/manifest.py's Manifest.from_json applies it where a manifest is read)."""

from __future__ import annotations

import math
import re
from typing import Any

from twice.core.errors import CorruptRecord

__all__ = ["FIELDS", "SHAPES", "STREAM", "check"]


_HINT = "the manifest is damaged or was edited: re-record the run (twice never guesses a verdict)"


# A trace stream's name: "main" (trace.jsonl) or a tag of dot-separated words ("rank3", "proc1-2",
# "rank0.sub1": trace.<tag>.jsonl). store/layout.py names the files from it.
STREAM = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def _is_stream(value: Any) -> bool:
    return isinstance(value, str) and STREAM.fullmatch(value) is not None


def _is_int(value: Any, low: int = -(2**63), high: int = 2**63 - 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return -(2**64) < value < 2**64 if isinstance(value, int) else math.isfinite(value)


def _check(ok: bool, where: str, key: str, expected: str, value: Any) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise CorruptRecord(f"{where}: {key} must be {expected}, not {shown}", _HINT)


# What twice reads of a manifest, each with the check it must pass: (part, key, expected, test,
# required).
def _is_git_facts(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    untracked = value.get("untracked_by_digest", [])
    return isinstance(untracked, list) and all(
        isinstance(entry, dict)
        and isinstance(entry.get("path"), str)
        and _is_int(entry.get("size"), 0)
        and isinstance(entry.get("xxh3"), str)
        for entry in untracked
    )


_FIELDS: tuple[tuple[str, str, str, Any, bool], ...] = (
    (
        "identity",
        "argv",
        "a list of strings",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        True,
    ),
    ("identity", "seed", "an integer or null", lambda v: v is None or _is_int(v, 0, 2**64), False),
    ("identity", "observe", "true or false", lambda v: isinstance(v, bool), False),
    (
        "identity",
        "determinism",
        "an object with a string 'mode'",
        lambda v: isinstance(v, dict) and isinstance(v.get("mode", ""), str),
        False,
    ),
    (
        "identity",
        "env",
        "an object of strings",
        lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
        False,
    ),
    (
        "identity",
        "code",
        "an object whose 'git' is null or an object listing untracked files by digest",
        lambda v: isinstance(v, dict) and _is_git_facts(v.get("git")),
        False,
    ),
    ("context", "status", "a string", lambda v: isinstance(v, str), True),
    ("context", "exit_code", "an integer or null", lambda v: v is None or _is_int(v), False),
    ("context", "steps", "a count or null", lambda v: v is None or _is_int(v, 0), False),
    ("context", "stopped_after", "a count or null", lambda v: v is None or _is_int(v, 0), False),
    ("context", "trace_every", "a positive integer", lambda v: _is_int(v, 1), False),
    ("context", "params_every", "a count or null", lambda v: v is None or _is_int(v, 0), False),
    ("context", "full_every", "a count or null", lambda v: v is None or _is_int(v, 1), False),
    ("context", "cwd", "a path", lambda v: isinstance(v, str), False),
    (
        "context",
        "streams",
        "a list of stream names",
        lambda v: isinstance(v, list) and all(_is_stream(s) for s in v) and len(set(v)) == len(v),
        False,
    ),
    ("context", "git_root", "a path or null", lambda v: v is None or isinstance(v, str), False),
    (
        "context",
        "loss_fault",
        "an object with a step, a value and nan_from",
        lambda v: (
            isinstance(v, dict)
            and _is_int(v.get("step"), 0)
            and v.get("value") in ("inf", "-inf", "nan")
            and (v.get("nan_from") is None or _is_int(v.get("nan_from"), 0))
        ),
        False,
    ),
    (
        "context",
        "outputs",
        "an object of files, each with a size and an xxh3 digest or null",
        lambda v: (
            isinstance(v, dict)
            and all(
                isinstance(entry, dict)
                and _is_int(entry.get("size"), 0)
                and (entry.get("xxh3") is None or isinstance(entry.get("xxh3"), str))
                and (entry.get("dcp_state") is None or isinstance(entry.get("dcp_state"), str))
                for entry in v.values()
            )
        ),
        False,
    ),
    (
        "context",
        "events",
        "an object of event counts",
        lambda v: (
            v is None
            or (
                isinstance(v, dict)
                and all(
                    _is_int(v.get(k, 0), 0)
                    for k in ("batches", "backward_calls", "optimizer_steps", "steps")
                )
            )
        ),
        False,
    ),
    (
        "context",
        "launcher",
        "an object with a process id",
        lambda v: (
            isinstance(v, dict)
            and (v.get("pid") is None or _is_int(v.get("pid"), 1, 2**22))
            and (v.get("start_time") is None or _is_int(v.get("start_time"), 0))
        ),
        False,
    ),
)


# -- the rest of the record, as small checks composed: every section twice writes has its shape,
# so a value of the wrong type is refused where the manifest is read, not where it is used.
def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool)) or _is_int(v) or _is_number(v)


def _map_of(check: Any) -> Any:
    return lambda v: isinstance(v, dict) and all(check(x) for x in v.values())


def _list_of(check: Any) -> Any:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _nullable(check: Any) -> Any:
    return lambda v: v is None or check(v)


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _shape(**checks: Any) -> Any:
    """An object whose named keys, where present, pass their checks (others: JSON scalars)."""
    return lambda v: (
        isinstance(v, dict)
        and all(
            checks[k](x) if k in checks else _scalar(x) or isinstance(x, (dict, list))
            for k, x in v.items()
        )
    )


# A time twice writes: seconds since 1970, from then to the year 5000.
_LATEST = 95_617_584_000


def _time(v: Any) -> bool:
    return _is_number(v) and 0 <= v <= _LATEST


_SHAPES: tuple[tuple[str, str, str, Any], ...] = (
    ("identity", "schema", "an integer", _is_int),
    ("identity", "torch", "an object of facts (strings, numbers, true/false)", _map_of(_scalar)),
    ("identity", "threads", "an object of thread counts", _map_of(lambda v: _is_int(v, 0))),
    ("identity", "packages", "an object of package versions", _map_of(_text)),
    ("identity", "package_files", "an object of package files' digests", _map_of(_text)),
    ("identity", "python", "an object of facts", _map_of(_scalar)),
    ("identity", "os", "an object of facts", _map_of(_scalar)),
    ("identity", "cpu", "an object of facts", _map_of(_scalar)),
    ("identity", "gpus", "a list", lambda v: isinstance(v, list)),
    ("identity", "cuda_devices", "a list of objects", _list_of(_map_of(_scalar))),
    ("identity", "config", "an object (the run's configuration)", lambda v: isinstance(v, dict)),
    ("identity", "inputs", "an object of the files read and their digests", _map_of(_text)),
    (
        "context",
        "inputs",
        "a list of the files read, each with a path, a size and a digest or null",
        _list_of(
            _shape(
                path=_text,
                size=lambda v: _is_int(v, 0),
                mtime_ns=lambda v: _is_int(v, 0),
                xxh3=_nullable(_text),
                sampled=lambda v: isinstance(v, bool),
                changed=lambda v: isinstance(v, bool),
                inode=lambda v: _is_int(v, 0),
                outside=lambda v: isinstance(v, bool),
                not_hashed=_text,
                made_by_run=lambda v: isinstance(v, bool),
                code=lambda v: isinstance(v, bool),
            )
        ),
    ),
    (
        "context",
        "inputs_coverage",
        "an object of what the record of the files read covers (store/inputs.py coverage)",
        _shape(
            scope=_text,
            unrecorded=lambda v: isinstance(v, bool),
            **{
                key: lambda v: _is_int(v, 0)
                for key in ("files", "outside", "not_hashed", "sampled", "changed", "made_by_run")
            },
        ),
    ),
    ("context", "inputs_roots", "a list of folders", _list_of(_text)),
    (
        "context",
        "recording",
        "an object of the recording settings (core/manifest.py RECORDING)",
        _shape(
            trace_every=lambda v: _is_int(v, 1),
            params_every=_nullable(lambda v: _is_int(v, 0)),
            full_every=_nullable(lambda v: _is_int(v, 1)),
            max_steps=_nullable(lambda v: _is_int(v, 1)),
            record_ops=_nullable(_text),
            numerics=_nullable(_text),
            inputs=_list_of(_text),
            inputs_exclude=_list_of(_text),
            mlflow=lambda v: isinstance(v, bool),
        ),
    ),
    (
        "context",
        "seeding",
        "an object of the script's seeding calls and the APIs watched for them",
        _shape(
            calls=_list_of(
                _shape(
                    api=_text,
                    site=_text,
                    calls=lambda v: _is_int(v, 1),
                    values=_nullable(_text),
                    entropy=lambda v: _is_int(v, 0),
                )
            ),
            watched=_list_of(_text),
        ),
    ),
    ("context", "inputs_exclude", "a list of folders", _list_of(_text)),
    ("context", "env_digests", "an object of variable names and digests", _map_of(_text)),
    (
        "identity",
        "distributed",
        "an object with a world size, a backend, the ranks recorded and the sharding",
        _shape(
            world_size=lambda v: _is_int(v, 1, 2**31),
            backend=_nullable(_text),
            ranks_recorded=_list_of(lambda v: _is_int(v, 0, 2**31)),
            sharding=_shape(meshes=_list_of(_text), placements=_map_of(_text)),
        ),
    ),
    (
        "identity",
        "determinism",
        "an object of the mode, the portable flag and the settings in effect",
        _shape(
            mode=lambda v: v in ("strict", "warn", "off", "observe"),
            portable=lambda v: isinstance(v, bool),
            in_effect=_map_of(_scalar),
            problems=_map_of(_text),
        ),
    ),
    (
        "identity",
        "code",
        "an object of the script, its sources and the git facts",
        _shape(
            git=_is_git_facts,
            script=_nullable(_shape(path=_text, digest=_nullable(_text))),
            sources=_map_of(_nullable(_text)),
            read_as_data=_map_of(_text),
        ),
    ),
    ("context", "started", "a time in seconds since 1970, or null", _nullable(_time)),
    ("context", "ended", "a time in seconds since 1970, or null", _nullable(_time)),
    ("context", "executable", "a list of strings", _list_of(_text)),
    ("context", "child_pid", "a process id", lambda v: v is None or _is_int(v, 1, 2**22)),
    ("context", "signal", "a signal's name", _nullable(_text)),
    ("context", "host", "a host name", _nullable(_text)),
    ("context", "user", "a user name", _nullable(_text)),
    ("context", "processes", "a count", _nullable(lambda v: _is_int(v, 0))),
    (
        "context",
        "signature",
        "an HMAC's hex digits",
        lambda v: isinstance(v, str) and len(v) <= 128,
    ),
    (
        "context",
        "portable_uncovered",
        "a list of objects naming an op",
        _list_of(_shape(op=_text)),
    ),
    (
        "context",
        "portable_compiled_eagerly",
        "a count",
        lambda v: _is_int(v, 0),
    ),
    (
        "context",
        "launcher",
        "an object with a host and a process id",
        _shape(
            host=_nullable(_text),
            pid=lambda v: v is None or _is_int(v, 1, 2**22),
            start_time=lambda v: v is None or _is_int(v, 0),
        ),
    ),
)


FIELDS = _FIELDS
SHAPES = _SHAPES
check = _check
