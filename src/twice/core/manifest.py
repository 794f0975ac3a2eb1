"""The run's manifest: an identity (what decides the result, compared) and a context (never
compared)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twice.core.manifest_schema import FIELDS as _FIELDS
from twice.core.manifest_schema import SHAPES as _SHAPES
from twice.core.manifest_schema import check as _check

__all__ = [
    "Manifest",
    "Difference",
    "compare_identity",
    "GROUPS",
    "group_of",
    "MISSING",
    "RECORDING",
    "recording_differences",
]

# The order in which difference groups are reported, and which identity keys fall in each.
GROUPS = (
    "data",
    "code",
    "arguments",
    "packages",
    "hardware",
    "threads",
    "environment",
    "determinism",
    "seeds",
)
_GROUP_OF_TOP = {
    "inputs": "data",
    "code": "code",
    "argv": "arguments",
    "config": "arguments",
    "command": "arguments",
    "packages": "packages",
    "package_files": "packages",
    "python": "packages",
    "torch": "packages",
    "cpu": "hardware",
    "gpus": "hardware",
    "os": "hardware",
    "cuda_devices": "hardware",
    "threads": "threads",
    "env": "environment",
    "determinism": "determinism",
    "seed": "seeds",
    "observe": "determinism",
    "distributed": "hardware",
}
_THREAD_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


@dataclass(frozen=True)
class Difference:
    """One identity value that differs between two runs (`missing` where a side lacks it)."""

    group: str
    key: str
    a: Any
    b: Any

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {"group": self.group, "key": self.key, "a": self.a, "b": self.b}


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():  # an empty dict adds nothing: {} and a missing key agree
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def group_of(key: str) -> str:
    """The difference group an identity key belongs to (code, arguments, packages, ...)."""
    top = key.split(".", 1)[0]
    if top == "env" and key.split(".", 1)[-1] in _THREAD_ENV:
        return "threads"
    return _GROUP_OF_TOP.get(top, "environment")


MISSING = "<missing>"
_MISSING = MISSING


def _said_otherwise(key: str, va: Any, vb: Any, flat_a: dict, flat_b: dict) -> bool:
    """A package's installed files are a difference only where both runs recorded them (a run of
    an older twice did not) and its version is the same: a new version says it better."""
    if not key.startswith("package_files."):
        return False
    version = "packages." + key.split(".", 1)[1]
    return _MISSING in (va, vb) or flat_a.get(version) != flat_b.get(version)


def compare_identity(a: dict, b: dict) -> list[Difference]:
    """Every identity value that differs, grouped (GROUPS order) and sorted by key within a
    group."""
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(a, "", flat_a)
    _flatten(b, "", flat_b)
    diffs = []
    for key in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(key, _MISSING), flat_b.get(key, _MISSING)
        if va != vb and not _said_otherwise(key, va, vb, flat_a, flat_b):
            diffs.append(Difference(group_of(key), key, va, vb))
    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(diffs, key=lambda d: (order.get(d.group, len(GROUPS)), d.key))


# The recording settings: what `twice run` recorded, how often and for how long, never what the
# training did. They live in the context (context.recording), apart from the identity, and a
# difference in them is named as such, never as a difference of training. (key, option)
RECORDING = (
    ("trace_every", "--trace-every"),
    ("params_every", "--params-every"),
    ("full_every", "--full-every"),
    ("max_steps", "--max-steps"),
    ("record_ops", "--record-ops"),
    ("numerics", "--numerics"),
    ("inputs", "--inputs"),
    ("inputs_exclude", "--inputs-exclude"),
    ("mlflow", "--mlflow"),
)
# Their values where a run did not choose them (a manifest of an older twice lacks the rest).
_RECORDING_DEFAULTS = {"trace_every": 1, "inputs": [], "inputs_exclude": [], "mlflow": False}


def recording_differences(a: Manifest, b: Manifest) -> list[Difference]:
    """The recording settings two runs differ in (group "recording"), in RECORDING order."""
    ra, rb = a.recording, b.recording
    return [
        Difference("recording", option, ra.get(key), rb.get(key))
        for key, option in RECORDING
        if ra.get(key) != rb.get(key)
    ]


@dataclass(frozen=True)
class Manifest:
    """A manifest read and validated: `identity` (compared between runs) and `context` (never
    compared), with typed access to every field twice itself reads."""

    identity: dict
    context: dict

    @classmethod
    def from_json(cls, data: Any, where: str) -> Manifest:
        """Validate a manifest's JSON value; a field of the wrong shape is a CorruptRecord naming
        `where` (the file) and the key."""
        _check(isinstance(data, dict), where, "the manifest", "a JSON object", data)
        for part in ("identity", "context"):
            _check(isinstance(data.get(part), dict), where, part, "an object", data.get(part))
        for part, key, expected, test, required in _FIELDS:
            section = data[part]
            if key not in section:
                _check(not required, where, f"{part}.{key}", expected, "missing")
                continue
            _check(test(section[key]), where, f"{part}.{key}", expected, section[key])
        for part, key, expected, test in _SHAPES:
            if key in data[part]:
                _check(test(data[part][key]), where, f"{part}.{key}", expected, data[part][key])
        return cls(data["identity"], data["context"])

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {"identity": self.identity, "context": self.context}

    argv = property(lambda self: list(self.identity["argv"]))
    seed = property(lambda self: self.identity.get("seed"))
    observe = property(lambda self: bool(self.identity.get("observe")))
    determinism = property(lambda self: self.identity.get("determinism", {}).get("mode", "strict"))
    portable = property(lambda self: bool(self.identity.get("determinism", {}).get("portable")))
    env = property(lambda self: dict(self.identity.get("env", {})))
    status = property(lambda self: self.context["status"])
    exit_code = property(lambda self: self.context.get("exit_code"))
    steps = property(lambda self: self.context.get("steps"))
    stopped_after = property(lambda self: self.context.get("stopped_after"))
    env_digests = property(lambda self: self.context.get("env_digests"))
    full_every = property(lambda self: self.context.get("full_every"))
    trace_every = property(lambda self: self.context.get("trace_every") or 1)

    @property
    def recording(self) -> dict:
        """Every recording setting (RECORDING's keys): context.recording, or for a manifest
        written before it the keys the context held on their own."""
        found = self.context.get("recording")
        if found is None:
            found = {key: self.context.get(key) for key in ("params_every", "full_every")}
            found["trace_every"] = self.trace_every
            found["max_steps"] = self.context.get("stop_after")
        return {**_RECORDING_DEFAULTS, **{k: v for k, v in found.items() if v is not None}}

    params_every = property(lambda self: self.context.get("params_every"))
    started = property(lambda self: self.context.get("started"))
    cwd = property(lambda self: self.context.get("cwd", "."))
    git_root = property(lambda self: self.context.get("git_root"))
    loss_fault = property(lambda self: self.context.get("loss_fault"))
    events = property(lambda self: self.context.get("events"))
    outputs = property(lambda self: self.context.get("outputs") or {})
    launcher = property(lambda self: self.context.get("launcher", {}))
    # The trace streams the run wrote (None: a run still running, or recorded before the list).
    streams = property(lambda self: self.context.get("streams"))
