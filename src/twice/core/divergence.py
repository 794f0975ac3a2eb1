"""Where two step traces part, and what differed there (pure: records in, findings out; the
sentence saying why is core/causes.py's)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

from twice.core.records import CAUSAL_ORDER, StepRecord, differing_fields

__all__ = [
    "Divergence",
    "first_divergence",
    "divergence_phrase",
    "loss_gap",
    "FIELD_MEANING",
]

FIELD_MEANING = {
    "params_before": "parameters before the step (the starting state)",
    "batch": "data (batch)",
    "rng": "RNG state",
    "loss": "loss (forward)",
    "grads": "gradients (backward)",
    "grad_norm": "gradient norm (backward)",
    "lr": "learning rate (schedule)",
    "params": "parameters (update)",
}


@dataclass
class Divergence:
    """The first step at which two traces differ, and what differed there, first cause first."""

    stream: str
    step: int
    fields: list[str]
    tensors: dict[str, list[str]] = field(default_factory=dict)
    rng_sources: list[str] = field(default_factory=list)
    loss_a: Any = None
    loss_b: Any = None
    identical_before: int = 0
    recorded: tuple[str, ...] = CAUSAL_ORDER  # compared fields both records hold at this step
    start_known: bool = True  # the state before this step was recorded in both and equal

    @property
    def first(self) -> str:
        """The first field that differs, in causal order: where to look first."""
        return self.fields[0]

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        data = {
            "stream": self.stream,
            "step": self.step,
            "fields": self.fields,
            "first": self.first,
            "tensors": self.tensors,
            "rng_sources": self.rng_sources,
            "identical_steps_before": self.identical_before,
        }
        if "loss" in self.fields:
            data.update(
                loss_a=self.loss_a, loss_b=self.loss_b, **loss_gap(self.loss_a, self.loss_b)
            )
        return data


def divergence_phrase(divergence: Divergence, resumed_at: int | None = None) -> str:
    """The one phrasing of a first divergence, in every verdict that states one (`diff`, `verify`,
    `verify-resume`, the pytest assertions): `first divergence at step 412 in rank1 (loss
    (forward))`, marked as the first resumed step where it is `resumed_at`."""
    where = "" if divergence.stream == "main" else f" in {divergence.stream}"
    resumed = " (the first resumed step)" if divergence.step == resumed_at else ""
    return (
        f"first divergence at step {divergence.step}{where}{resumed} "
        f"({FIELD_MEANING[divergence.first]})"
    )


def _as_floats(value: Any) -> list[float]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    out = []
    for item in values:
        text = str(item)
        out.append(float("nan") if text.startswith("nan") else float.fromhex(text))
    return out


def _ordered_bits32(value: float) -> int | None:
    try:
        packed = struct.pack("<f", value)
    except OverflowError:
        return None
    if struct.unpack("<f", packed)[0] != value:
        return None
    bits = struct.unpack("<i", packed)[0]
    return bits if bits >= 0 else -(bits & 0x7FFFFFFF)


def loss_gap(a: Any, b: Any) -> dict[str, Any]:
    """Absolute difference of the first losses, and their distance in float32 ulps where both are
    float32."""
    fa, fb = _as_floats(a), _as_floats(b)
    if not fa or not fb:
        return {}
    x, y = fa[0], fb[0]
    if math.isnan(x) or math.isnan(y):
        return {"abs": None, "ulps": None}
    bx, by = _ordered_bits32(x), _ordered_bits32(y)
    return {"abs": abs(x - y), "ulps": abs(bx - by) if bx is not None and by is not None else None}


def _differing(a: dict | None, b: dict | None) -> list[str]:
    if not a and not b:
        return []
    a, b = a or {}, b or {}
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _held(value: Any) -> bool:
    return value is not None and value != [] and value != {}


def first_divergence(
    a: list[StepRecord],
    b: list[StepRecord],
    stream: str = "main",
    resumed: bool = False,
    partial: frozenset[str] = frozenset(),
) -> Divergence | None:
    """The first step recorded in both traces whose compared fields differ, or None.

    Steps recorded in only one trace are not compared here; app/compare.py reports them as a
    difference of their own. Every field but records.NOT_COMPARED is compared; those in
    `partial` only where both records hold them (records.differing_fields).
    """
    by_step_b = {record.step: record for record in b}
    same, last_same = 0, -1
    for record_a in a:
        record_b = by_step_b.get(record_a.step)
        if record_b is None:
            continue
        fields = differing_fields(record_a, record_b, resumed, partial)
        if not fields:
            same, last_same = same + 1, record_a.step
            continue
        tensors = {}
        for name, attr in (("params", "param_digests"), ("grads", "grad_digests")):
            differing = _differing(getattr(record_a, attr), getattr(record_b, attr))
            if differing:
                tensors[name] = differing
        held_before = _held(record_a.params_before) and _held(record_b.params_before)
        return Divergence(
            start_known=(record_a.step > 0 and last_same == record_a.step - 1) or held_before,
            stream=stream,
            step=record_a.step,
            fields=fields,
            tensors=tensors,
            rng_sources=_differing(record_a.rng, record_b.rng),
            loss_a=record_a.loss,
            loss_b=record_b.loss,
            identical_before=same,
            recorded=tuple(
                name
                for name in CAUSAL_ORDER
                if _held(getattr(record_a, name)) and _held(getattr(record_b, name))
            ),
        )
    return None
