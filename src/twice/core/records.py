"""The step record: the exact fingerprint of one training step, and its line in a trace.

A record holds exact evidence only: digests, and floats as `float.hex` text, so that two traces
compare bit for bit.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "StepRecord",
    "COMPARED_FIELDS",
    "NOT_COMPARED",
    "FIELD_OF",
    "CAUSAL_ORDER",
    "differing_fields",
    "record_line",
    "iter_values",
    "is_digest",
    "is_hex_float",
]

# The fields two runs are compared on, in causal order within a step: what came in (data, RNG),
# the forward pass (loss), the backward pass (gradients), the update (parameters).
COMPARED_FIELDS = ("batch", "rng", "loss", "grads", "grad_norm", "lr", "params")

# The one list of what a record holds but two runs are not compared on: when the step ended.
NOT_COMPARED = frozenset({"time"})

# Every other field is compared, and a difference in it is reported under the causal field it
# belongs to (the per-tensor digests under their totals, a skipped update under the parameters).
# params_before is the state a process started from: before everything else in causal order.
FIELD_OF = {
    "batch": "batch",
    "rng": "rng",
    "loss": "loss",
    "grads": "grads",
    "grad_digests": "grads",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "params": "params",
    "param_digests": "params",
    "params_full": "params",
    "skipped": "params",
    "params_before": "params_before",
}
CAUSAL_ORDER = ("params_before", *COMPARED_FIELDS)


@dataclass
class StepRecord:
    """The exact fingerprint of one training step."""

    step: int
    loss: Any = None  # float.hex of the loss, or a list when backward ran several times
    batch: str | None = None  # digest of the batches the step consumed
    grads: str | None = None  # digest of all gradients the optimizers used
    grad_norm: str | None = None  # float.hex of the total L2 gradient norm
    lr: list[str] = field(default_factory=list)
    params: str | None = None  # digest of all parameters after the update
    rng: dict[str, str] = field(default_factory=dict)
    param_digests: dict[str, str] | None = None  # per tensor, at the --params-every interval
    grad_digests: dict[str, str] | None = None
    params_before: str | None = None  # parameters before the first step after a resume
    # every --full-every steps: the parameters' digest as whole tensors (a DTensor gathered), the
    # same whatever the mesh and placements
    params_full: str | None = None
    skipped: bool | None = (
        None  # True: GradScaler skipped the update (inf/NaN gradients), parameters unchanged
    )
    time: float | None = None  # seconds since the recorder started: context, never compared

    def to_json(self) -> dict:
        # Shallow on purpose: asdict() deep-copies every field and cost more than the digests. One
        # comprehension over the names, not a generator feeding it: once a step, on cold caches.
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            name: value
            for name in _FIELD_NAMES
            if (value := getattr(self, name)) is not None and value != {} and value != []
        }

    @classmethod
    def from_json(cls, data: Any) -> StepRecord:
        """A record from a trace line's JSON value, every field checked for its type; fields this
        version does not know are ignored. Raises ValueError naming the field at fault."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {_kind(data)}")
        known = {}
        for name, check in _CHECKS.items():
            if name in data:
                value = data[name]
                if not check(value):
                    raise ValueError(
                        f"field {name!r}: expected {_EXPECTED[name]}, found {_kind(value)}"
                    )
                known[name] = value
        if "step" not in known:
            raise ValueError("field 'step' is missing")
        if not any(_held(known.get(name)) for name in FIELD_OF):
            raise ValueError("it holds no evidence: a record holds at least one compared field")
        return cls(**known)


_FIELD_NAMES = tuple(StepRecord.__dataclass_fields__)
assert set(_FIELD_NAMES) == set(FIELD_OF) | NOT_COMPARED | {"step"}, (
    "a field neither compared nor declared not compared"
)


def _held(value: Any) -> bool:
    return value is not None and value != {} and value != []


def differing_fields(
    a: StepRecord, b: StepRecord, resumed: bool = False, partial: frozenset[str] = frozenset()
) -> list[str]:
    """The causal fields (CAUSAL_ORDER) in which two records of one step differ: every field but
    those in NOT_COMPARED. A field one record holds and the other lacks differs, except, where a
    run `resumed` (its trace starts later than the other's), params_before: a process records it
    once, on the first record of its trace, so a resumed run holds it at a step where the
    uninterrupted run does not; there it is compared where both hold it. So are the fields in
    `partial`: those the two runs' recording settings had them record at other steps
    (--params-every, --full-every), where one lacking them says nothing about training."""
    found = set()
    for name, causal in FIELD_OF.items():
        va, vb = getattr(a, name), getattr(b, name)
        if (name in partial or (name == "params_before" and resumed)) and not (
            _held(va) and _held(vb)
        ):
            continue
        if (va if _held(va) else None) != (vb if _held(vb) else None):
            found.add(causal)
    return [name for name in CAUSAL_ORDER if name in found]


# A step number a trace may hold: an int (not a bool), from 0 to the largest 64-bit one.
_MAX_STEP = 2**63 - 1


def _is_step(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_STEP


# What twice writes, exactly: a digest is xxh3-128's 32 lowercase hex digits; a float is
# digests.float_bits' text (float.hex, "inf", "-inf", or "nan:" and the 16 hex digits of its bits).
# csrc/records.c's record_valid accepts the same language (tests/unit/store/test_tracescan.py
# holds them equal).
_DIGEST = re.compile(r"[0-9a-f]{32}")
_HEX_FLOAT = re.compile(r"-?0x[01]\.[0-9a-f]{1,13}p[+-][0-9]{1,4}|-?inf|nan:[0-9a-f]{16}")
# A name in a per-tensor or RNG map: printable, without control characters, of a sane length.
_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,512}")


def is_digest(value: Any) -> bool:
    """Whether `value` is a digest as twice writes it (32 lowercase hex digits)."""
    return type(value) is str and _DIGEST.fullmatch(value) is not None


def is_hex_float(value: Any) -> bool:
    """Whether `value` is a float's exact text as twice writes it (digests.float_bits), with an
    exponent a double has (float.hex writes +1023 at most, -1022 at least)."""
    if type(value) is not str or _HEX_FLOAT.fullmatch(value) is None:
        return False
    mark = value.find("p")
    return mark < 0 or -1022 <= int(value[mark + 1 :]) <= 1023


def _is_optional_digest(value: Any) -> bool:
    return value is None or is_digest(value)


def _is_digest_map(value: Any) -> bool:
    return (
        type(value) is dict
        and len(value) <= 1 << 20
        and all(_NAME.fullmatch(k) and is_digest(v) for k, v in value.items())
    )


def _is_loss(value: Any) -> bool:
    return (
        value is None
        or is_hex_float(value)
        or (type(value) is list and all(is_hex_float(item) for item in value))
    )


def _is_time(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and math.isfinite(value) and value >= 0)


_CHECKS = {
    "step": _is_step,
    "loss": _is_loss,
    "batch": _is_optional_digest,
    "grads": _is_optional_digest,
    "grad_norm": lambda v: v is None or is_hex_float(v),
    "lr": lambda v: type(v) is list and all(is_hex_float(item) for item in v),
    "params": _is_optional_digest,
    "rng": _is_digest_map,
    "param_digests": lambda v: v is None or _is_digest_map(v),
    "grad_digests": lambda v: v is None or _is_digest_map(v),
    "params_before": _is_optional_digest,
    "params_full": _is_optional_digest,
    "skipped": lambda v: v is None or type(v) is bool,
    "time": _is_time,
}
_EXPECTED = {
    "step": f"a whole number from 0 to {_MAX_STEP}",
    "loss": "a float's exact text (float.hex), a list of them, or null",
    "lr": "a list of floats' exact texts (float.hex)",
    "grad_norm": "a float's exact text (float.hex) or null",
    "rng": "an object of names and digests (32 lowercase hex digits)",
    "param_digests": "an object of names and digests (32 lowercase hex digits)",
    "grad_digests": "an object of names and digests (32 lowercase hex digits)",
    "skipped": "true, false or null",
    "time": "a finite number of seconds, at least 0",
}
_EXPECTED.update(
    {
        name: "a digest (32 lowercase hex digits) or null"
        for name in _CHECKS
        if name not in _EXPECTED
    }
)
assert set(_CHECKS) == set(_FIELD_NAMES)


def _kind(value: Any) -> str:
    """What a JSON value is, for an error message (never the whole value: it may be huge)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 24 else f"a number of {len(text)} digits"
    names = {str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


# One encoder for all records: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))

# a record's line through orjson: ~13x faster than the json module's, which cost ~8% of tracing a
# small CNN
try:
    import orjson

    _ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
except ImportError:  # a platform without its wheel: the json module, the same records
    orjson = None


def record_line(record: StepRecord) -> bytes:
    """One record as its trace line: compact JSON, keys sorted, newline-terminated UTF-8. The same
    bytes through orjson or json for ASCII text; names beyond ASCII are written as UTF-8 by
    orjson and as \\u escapes by json, which read back the same."""
    data = record.to_json()
    if orjson is not None:
        try:
            return orjson.dumps(data, option=_ORJSON_OPTIONS)
        except (
            TypeError
        ):  # what orjson refuses and json takes (an int beyond 64 bits, a non-str key)
            pass
    return (_ENCODER.encode(data) + "\n").encode("utf-8")


def iter_values(record: StepRecord) -> Iterator[tuple[str, Any]]:
    """(field, value) of each compared field of `record`, in causal order."""
    for name in COMPARED_FIELDS:
        yield name, getattr(record, name)
