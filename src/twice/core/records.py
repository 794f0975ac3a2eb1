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

__all__ = ["StepRecord", "COMPARED_FIELDS", "record_line", "iter_values"]

# The fields two runs are compared on, in causal order within a step: what came in (data, RNG),
# the forward pass (loss), the backward pass (gradients), the update (parameters).
COMPARED_FIELDS = ("batch", "rng", "loss", "grads", "grad_norm", "lr", "params")


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
        return cls(**known)


_FIELD_NAMES = tuple(StepRecord.__dataclass_fields__)

# A step number a trace may hold: an int (not a bool), from 0 to the largest 64-bit one.
_MAX_STEP = 2**63 - 1


def _is_step(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_STEP


def _is_text(value: Any) -> bool:
    return type(value) is str


def _is_optional_text(value: Any) -> bool:
    return value is None or type(value) is str


def _is_text_map(value: Any) -> bool:
    return type(value) is dict and all(type(item) is str for item in value.values())


_NAN_BITS = re.compile(r"^nan:[0-9a-f]{16}$")


def _is_hex_float(value: Any) -> bool:
    """A float as digests.float_bits writes it: float.hex, 'inf', '-inf', or 'nan:' and the
    payload's 16 hex digits; of a sane length."""
    if type(value) is not str or not 0 < len(value) <= 40:
        return False
    if value.startswith("nan"):
        return bool(_NAN_BITS.match(value))
    try:
        float.fromhex(value)
    except ValueError:
        return False
    return True


def _is_loss(value: Any) -> bool:
    return (
        value is None
        or _is_hex_float(value)
        or (type(value) is list and all(_is_hex_float(item) for item in value))
    )


def _is_time(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and math.isfinite(value) and value >= 0)


_CHECKS = {
    "step": _is_step,
    "loss": _is_loss,
    "batch": _is_optional_text,
    "grads": _is_optional_text,
    "grad_norm": lambda v: v is None or _is_hex_float(v),
    "lr": lambda v: type(v) is list and all(_is_hex_float(item) for item in v),
    "params": _is_optional_text,
    "rng": _is_text_map,
    "param_digests": lambda v: v is None or _is_text_map(v),
    "grad_digests": lambda v: v is None or _is_text_map(v),
    "params_before": _is_optional_text,
    "skipped": lambda v: v is None or type(v) is bool,
    "time": _is_time,
}
_EXPECTED = {
    "step": f"a whole number from 0 to {_MAX_STEP}",
    "loss": "a float's exact text (float.hex), a list of them, or null",
    "lr": "a list of floats' exact texts (float.hex)",
    "grad_norm": "a float's exact text (float.hex) or null",
    "rng": "an object of digest strings",
    "param_digests": "an object of digest strings",
    "grad_digests": "an object of digest strings",
    "skipped": "true, false or null",
    "time": "a finite number of seconds, at least 0",
}
_EXPECTED.update({name: "a digest string or null" for name in _CHECKS if name not in _EXPECTED})
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
