"""Where two step traces part, and the most likely reason why (pure: records in, findings out)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

from twice.core.manifest import Difference
from twice.core.records import CAUSAL_ORDER, StepRecord, differing_fields

__all__ = [
    "explain_resumed",
    "Divergence",
    "first_divergence",
    "divergence_phrase",
    "explain",
    "loss_gap",
    "FIELD_MEANING",
    "EVIDENCE",
    "UNKNOWN",
    "missing_evidence",
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
    a: list[StepRecord], b: list[StepRecord], stream: str = "main", resumed: bool = False
) -> Divergence | None:
    """The first step recorded in both traces whose compared fields differ, or None.

    Steps recorded in only one trace are not compared here; app/compare.py reports them as a
    difference of their own. Every field but records.NOT_COMPARED is compared.
    """
    by_step_b = {record.step: record for record in b}
    same, last_same = 0, -1
    for record_a in a:
        record_b = by_step_b.get(record_a.step)
        if record_b is None:
            continue
        fields = differing_fields(record_a, record_b, resumed)
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
            start_known=(record_a.step > 0 and last_same == record_a.step - 1)
            or (record_a.step == 0 and held_before),
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


def _argv_change(diff: Difference) -> str:
    a, b = diff.a if isinstance(diff.a, list) else [], diff.b if isinstance(diff.b, list) else []
    only_a = [x for x in a if x not in b]
    only_b = [x for x in b if x not in a]
    if only_a or only_b:
        return (
            f"the command lines differ ({' '.join(only_a) or 'nothing'} vs "
            f"{' '.join(only_b) or 'nothing'})"
        )
    return "the command lines differ"


def _identity_reason(diffs: list[Difference]) -> str | None:
    """One clause naming the identity difference most likely to change results."""
    by_group: dict[str, list[Difference]] = {}
    for diff in diffs:
        by_group.setdefault(diff.group, []).append(diff)
    world = next((d for d in diffs if d.key == "distributed.world_size"), None)
    if world is not None:
        return (
            f"the runs used world sizes {world.a} and {world.b}: gradients are reduced in "
            f"another order, "
            "so bits differ unless training is world-size invariant"
        )
    if "data" in by_group:
        changed = [d.key.removeprefix("inputs.") for d in by_group["data"]]
        shown = ", ".join(changed[:3]) + (
            f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        )
        return f"the runs read different data: {shown} differ{'s' if len(changed) == 1 else ''}"
    if "seeds" in by_group:
        d = by_group["seeds"][0]

        def seed(value):
            return "no seed (--observe)" if value is None else value

        return f"the runs used different seeds ({seed(d.a)} and {seed(d.b)})"
    if "arguments" in by_group:
        return _argv_change(by_group["arguments"][0])
    if "code" in by_group:
        keys = sorted(
            {
                d.key.split(".", 2)[-1] if d.key.startswith("code.sources.") else d.key
                for d in by_group["code"]
            }
        )
        return f"the code differs ({', '.join(keys[:3])})"
    portable = next((d for d in diffs if d.key == "determinism.portable"), None)
    if portable is not None:
        return (
            "one run was portable (`twice run --portable`: twice's own kernels) and the other "
            "not, so their arithmetic differs"
        )
    if "threads" in by_group:
        d = next(
            (d for d in by_group["threads"] if d.key == "threads.intra_op_threads"),
            by_group["threads"][0],
        )
        return (
            f"the runs used {d.a} and {d.b} torch threads"
            if d.key == "threads.intra_op_threads"
            else f"{d.key} differs ({d.a} vs {d.b})"
        ) + PORTABLE_FIX
    versions = [d for d in by_group.get("packages", []) if d.key != "torch.cpu_capability"]
    if versions:
        d = versions[0]
        return f"package versions differ ({d.key}: {d.a} vs {d.b})"
    isa = next((d for d in diffs if d.key == "torch.cpu_capability"), None)
    if isa is not None:
        return f"torch's kernels used the instruction sets {isa.a} and {isa.b}" + PORTABLE_FIX
    if "hardware" in by_group:
        d = by_group["hardware"][0]
        fix = DEVICE_FIX if d.key.startswith(("gpus", "cuda_devices")) else PORTABLE_FIX
        return f"the hardware differs ({d.key}: {d.a} vs {d.b})" + fix
    if "determinism" in by_group:
        d = by_group["determinism"][0]
        return f"determinism settings differ ({d.key}: {d.a} vs {d.b})"
    if "environment" in by_group:
        d = by_group["environment"][0]
        name = d.key.removeprefix("env.")
        fix = PORTABLE_FIX if name in _MACHINE_ENV else ""
        return f"environment variable {name} differs ({d.a} vs {d.b})" + fix
    return None


PORTABLE_FIX = "; `twice run --portable` gives the same bits whatever that setting"
"""Appended to a cause portable mode removes: thread counts, instruction sets, BLAS code paths."""
DEVICE_FIX = (
    "; `twice run --portable` computes the CPU's bits on the GPU by construction (docs/portable.md)"
)
"""Appended to a difference of devices."""
_MACHINE_ENV = {
    "MKL_CBWR",
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_ENABLE_INSTRUCTIONS",
}


# What each field is called in a sentence, and what its difference means.
_NAMES = {
    "params_before": ("the starting parameters", "the runs started from different states"),
    "batch": ("batches", "the batches differ"),
    "rng": ("the RNG state", "the runs drew different random numbers"),
    "loss": ("the loss", "the forward computation differs"),
    "grads": ("gradients", "the backward computation differs"),
    "grad_norm": ("the gradient norm", "the norm computation differs"),
    "lr": ("the learning rate", "the schedule differs"),
    "params": ("parameters", "the update differs"),
}


def _stage(divergence: Divergence, reason: str | None) -> str:
    """What differed first, claiming "identical" only for what both records hold at that step."""
    first = divergence.first
    before = CAUSAL_ORDER[: CAUSAL_ORDER.index(first)]
    same = [_NAMES[name][0] for name in before if name in divergence.recorded]
    name, meaning = _NAMES[first]
    verb = (
        "differ"
        if name in ("batches", "gradients", "parameters", "the starting parameters")
        else "differs"
    )
    if first == "loss" and divergence.step == 0:
        meaning = "the initial weights or the forward computation differ"
    if first == "params" and reason is None and "grads" in divergence.recorded:
        meaning = (
            "something other than this step's update changed them (another process writing "
            "shared parameters without a lock, or a race)"
        )
    stage = f"{name} {verb}" if first == "batch" else f"{name} {verb}: {meaning}"
    if same:
        stage = f"{_join(same)} identical, {stage}"
    return stage


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# What "nondeterminism inside the run" rests on: everything upstream of the first difference
# recorded in both runs, and equal. Each piece, and what is said when it is missing.
EVIDENCE = ("inputs", "start", "batch", "rng")
UNKNOWN = {
    "inputs": "the files the runs read were not recorded (a run made outside `twice run`, or by "
    "an older twice)",
    "start": "the parameters before this step were not compared (the step before it was not "
    "recorded in both runs)",
    "batch": "the batches were not recorded (no DataLoader, and no module was called with data)",
    "rng": "the RNG states were not recorded",
}


def missing_evidence(divergence: Divergence, inputs_recorded: bool) -> list[str]:
    """The pieces of EVIDENCE that "nondeterminism inside the run" needs at this divergence and
    the records lack: the inputs, the starting state, and each compared field upstream of the
    first difference (in CAUSAL_ORDER) that not both records hold."""
    upstream = CAUSAL_ORDER[: CAUSAL_ORDER.index(divergence.first)]
    held = {
        "inputs": inputs_recorded,
        "start": divergence.start_known,
        "batch": "batch" in divergence.recorded,
        "rng": "rng" in divergence.recorded,
    }
    needed = [name for name in EVIDENCE if name in ("inputs", "start") or name in upstream]
    return [name for name in needed if not held[name]]


def explain(
    diffs: list[Difference],
    divergence: Divergence | None,
    observed: bool = False,
    inputs_recorded: bool = True,
) -> str:
    """One sentence: what differed first and the most likely cause, combining manifest and trace."""
    reason = _identity_reason(diffs)
    if divergence is None:
        if reason:  # identical: no fix to suggest
            reason = reason.removesuffix(PORTABLE_FIX).removesuffix(DEVICE_FIX)
        return (
            f"traces agree on every common step; {reason}"
            if reason
            else "traces agree on every common step"
        )
    stage = _stage(divergence, reason)
    sentence = f"{stage} at step {divergence.step}"
    names = divergence.tensors.get(divergence.first, [])
    if names:
        sentence += f" ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    if reason:
        return f"{sentence}; {reason}"
    if observed and divergence.first in ("batch", "rng", "loss"):
        return (
            f"{sentence}; the runs were recorded with --observe, so RNGs the script does not "
            f"seed itself "
            "start differently (run without --observe to seed every RNG)"
        )
    missing = missing_evidence(divergence, inputs_recorded)
    if missing:  # a cause only from its evidence: say what is unknown instead of guessing
        return (
            f"{sentence}; same code, seeds and settings, but the cause cannot be named from what "
            f"was recorded: {'; '.join(UNKNOWN[name] for name in missing)}"
        )
    source = (
        "a nondeterministic data pipeline"
        if divergence.first == "batch"
        else "a nondeterministic kernel, a race or unsynchronised shared state"
    )
    return (
        f"{sentence}; same code, seeds, settings, input files and starting state, and "
        "everything before it in the step equal: nondeterminism inside the run, not seeding "
        f"({source})"
    )


# What a resume failed to restore, by the first field that differs at the first resumed step.
_NOT_RESTORED = {
    "params_before": "the model's parameters",
    "batch": "the data position (the loader's or sampler's state)",
    "rng": "the RNG state",
    "loss": "the model's state, or something else the forward pass reads",
    "grads": "the model's state, or something else the backward pass reads",
    "grad_norm": "the gradient clipping or scaling state",
    "lr": "the learning-rate scheduler's state",
    "params": "the optimizer's state",
}


def explain_resumed(
    label: str, checkpoint: str, at: int, divergence: Divergence | None, lead: str | None = None
) -> str:
    """The explanation when run `label` resumed from `checkpoint` at step `at`: a difference at the
    first resumed step is state the resume did not restore, never "same code, seeds and
    settings". `lead` replaces the opening "run B resumed from ..." """
    resumed = lead or f"run {label} resumed from {checkpoint}"
    if divergence is None:
        return f"{resumed}; the runs agree from step {at} on"
    if divergence.step <= at:
        return (
            f"{resumed}; first divergence at the first resumed step: the resume did not restore "
            f"{_NOT_RESTORED[divergence.first]} ({_NAMES[divergence.first][0]} differ first)"
        )
    after = divergence.step - at
    return (
        f"{resumed} at step {at}; first divergence {after} step{'s' if after > 1 else ''} later, "
        f"at step {divergence.step} ({_NAMES[divergence.first][0]} differ first): state the "
        "checkpoint does not hold (a counter, a cache, a schedule kept outside tracked objects), "
        "or nondeterminism inside the run"
    )
