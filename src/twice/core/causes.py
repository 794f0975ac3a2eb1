"""Why two runs differ, in one sentence: what the manifests say (an input file, the seeds, the
code, the threads, ...) and what the traces say, each cause named only from its evidence (pure:
records in, sentences out)."""

from __future__ import annotations

from twice.core.coverage import InputPremise, code_names
from twice.core.divergence import Divergence
from twice.core.manifest import MISSING as _MISSING
from twice.core.manifest import Difference
from twice.core.records import CAUSAL_ORDER

__all__ = [
    "explain",
    "NAMES",
    "missing_evidence",
    "EVIDENCE",
    "UNKNOWN",
    "PORTABLE_FIX",
    "DEVICE_FIX",
]


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


def _identity_reason(
    diffs: list[Difference], seeding: str | None = None, inputs: InputPremise | None = None
) -> str | None:
    """One clause naming the identity difference most likely to change results; `seeding`: how
    the script's own seeding calls differ (core/seedcalls.py), after twice's own seeds."""
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
    sharding = [d for d in diffs if d.key.startswith("distributed.sharding.")]
    if sharding:
        meshes = next((d for d in sharding if d.key == "distributed.sharding.meshes"), None)
        if meshes is not None:
            return (
                f"the runs sharded their parameters on different device meshes ({meshes.a} and "
                f"{meshes.b}): each rank holds other shards and adds in another order, so bits "
                "differ"
            )
        d = sharding[0]
        name = d.key.removeprefix("distributed.sharding.placements.")
        return (
            f"the runs placed their parameters differently ({name}: {d.a} and {d.b}): each rank "
            "holds other shards, so bits differ"
        )
    if "data" in by_group and inputs is not None and inputs.clause():
        return inputs.clause()  # named from what the records cover (core/coverage.py)
    if "data" in by_group:
        phrases = []
        for d in by_group["data"]:
            name = d.key.removeprefix("inputs.")
            if d.a == _MISSING or d.b == _MISSING:
                phrases.append(f"{name} was read by {'B' if d.a == _MISSING else 'A'} only")
            else:
                phrases.append(f"{name} differs")
        more = f" and {len(phrases) - 3} more" if len(phrases) > 3 else ""
        return f"the runs read different data: {', '.join(phrases[:3])}{more}"
    if "seeds" in by_group:
        d = by_group["seeds"][0]

        def seed(value):
            return "no seed (--observe)" if value is None else value

        return f"the runs used different seeds ({seed(d.a)} and {seed(d.b)})"
    if seeding:
        return seeding
    if "arguments" in by_group:
        return _argv_change(by_group["arguments"][0])
    if "code" in by_group:
        keys = code_names([d.key for d in by_group["code"]])
        return f"the code differs ({'; '.join(keys[:3])})"
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
        if d.key.startswith("package_files."):  # the same version, other files (an edited build)
            name = d.key.removeprefix("package_files.")
            return f"packages differ: {name}'s installed files differ, at the same version"
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
NAMES = {
    "params_before": ("the starting parameters", "the runs started from different states"),
    "batch": ("batches", "the batches differ"),
    "rng": ("the RNG state", "the runs drew different random numbers"),
    "loss": ("the loss", "the forward computation differs"),
    "grads": ("gradients", "the backward computation differs"),
    "grad_norm": ("the gradient norm", "the norm computation differs"),
    "lr": ("the learning rate", "the schedule differs"),
    "params": ("parameters", "the update differs"),
}


# What a step computes from the parameters it starts with: a difference in it means what NAMES
# says only where those parameters were compared equal.
_FROM_START = ("loss", "grads", "grad_norm", "params")


def _stage(divergence: Divergence, reason: str | None) -> str:
    """What differed first, claiming "identical" only for what both records hold at that step."""
    first = divergence.first
    before = CAUSAL_ORDER[: CAUSAL_ORDER.index(first)]
    same = [NAMES[name][0] for name in before if name in divergence.recorded]
    name, meaning = NAMES[first]
    verb = (
        "differ"
        if name in ("batches", "gradients", "parameters", "the starting parameters")
        else "differs"
    )
    if first == "loss" and divergence.step == 0:
        meaning = "the initial weights or the forward computation differ"
    if first == "params" and reason is None and {"grads", "lr"} <= set(divergence.recorded):
        meaning = (
            "something other than this step's update changed them (another process writing "
            "shared parameters without a lock, or a race)"
        )
    plain = first == "batch" or _start_unseen(divergence)  # what it means is not known
    stage = f"{name} {verb}" if plain else f"{name} {verb}: {meaning}"
    if same:
        stage = f"{_join(same)} identical, {stage}"
    return stage


def _start_unseen(divergence: Divergence) -> bool:
    """Whether what differs first is computed from parameters that were not compared."""
    return divergence.first in _FROM_START and not divergence.start_known and divergence.step > 0


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
    # where the starting state is what differs, it is the finding, not evidence to hold
    start = () if divergence.first == "params_before" else ("start",)
    needed = [name for name in EVIDENCE if name in ("inputs", *start) or name in upstream]
    return [name for name in needed if not held[name]]


def _unknown(name: str, inputs: InputPremise | None) -> str:
    """What is missing of EVIDENCE: for the inputs, what the records do not cover of them."""
    if name == "inputs" and inputs is not None and inputs.recorded and inputs.gaps:
        return inputs.unknown()
    return UNKNOWN[name]


def _child_stream(stream: str) -> bool:
    """A stream of a process the script started (forkN, procN, subN), whose parameters may be
    shared with, and changed by, the others."""
    last = stream.rsplit(".", 1)[-1]
    return last.startswith(("fork", "proc", "sub"))


def explain(
    diffs: list[Difference],
    divergence: Divergence | None,
    observed: bool = False,
    inputs_recorded: bool = True,
    env_changed: list[str] | None = None,
    seeding: str | None = None,
    inputs: InputPremise | None = None,
) -> str:
    """One sentence: what differed first and the most likely cause, combining manifest and trace.
    `env_changed`: the environment variables the launches differed in (None: not recorded).
    `inputs`: how the files the runs read compare and what the records cover of them
    (core/coverage.py): a differing file is the cause, a gap takes "same input files" away.
    `seeding`: how the script's own seeding calls differ (core/seedcalls.py), the cause where
    what differs first is what an RNG decides (the starting state, batches, RNG states, the
    loss); elsewhere it only takes "same seeds" away."""
    drawn = divergence is not None and (
        divergence.first in ("params_before", "batch", "rng", "loss") or "rng" in divergence.fields
    )
    reason = _identity_reason(diffs, seeding if drawn or divergence is None else None, inputs)
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
    if _start_unseen(divergence):
        sentence += (
            f", but the parameters it starts from were not compared (step {divergence.step - 1} "
            "was not recorded in both runs, as with --trace-every): the difference may have "
            "arisen in the steps before it"
        )
    if reason:
        return f"{sentence}; {reason}"
    if observed and divergence.first in ("params_before", "batch", "rng", "loss"):
        return (
            f"{sentence}; the runs were recorded with --observe, so RNGs the script does not "
            f"seed itself "
            "start differently (run without --observe to seed every RNG)"
        )
    if seeding:  # not what an RNG decides: no cause to name, and the seeds were not the same
        return (
            f"{sentence}; the cause cannot be named from what was recorded: the runs were not "
            f"seeded alike ({seeding})"
        )
    if divergence.first == "lr":
        # A learning rate is set by the script, not computed by a kernel from this step's data:
        # with everything upstream equal it differs because the runs were configured apart.
        return f"{sentence}; {_unrecorded_configuration(env_changed)}"
    if divergence.first == "params" and "lr" not in divergence.recorded:
        # an update by hand: its learning rate is the script's own number, which no record holds
        return f"{sentence}; {_unrecorded_update(env_changed)}"
    covered = inputs_recorded and (inputs is None or inputs.complete)
    missing = missing_evidence(divergence, covered)
    if missing:  # a cause only from its evidence: say what is unknown instead of guessing
        return (
            f"{sentence}; same code, seeds and settings, but the cause cannot be named from what "
            f"was recorded: {'; '.join(_unknown(name, inputs) for name in missing)}"
        )
    if divergence.first == "params_before" and not _child_stream(divergence.stream):
        # the launched process's (or a rank's) own initial weights: twice records no RNG state
        # before the first step, so what made them differ is not in the records
        return (
            f"{sentence}; same code, seeds, settings and input files, but the cause cannot be "
            "named from what was recorded: the model's initial parameters differ, and no RNG "
            "state is recorded before the first step (an RNG seeded outside twice's reach, or "
            "weights loaded from a file outside the recorded inputs)"
        )
    if divergence.first == "params_before":  # a child process: before its first update
        return (
            f"{sentence}; same code, seeds, settings and input files: nondeterminism inside the "
            "run, not seeding (the process started from other parameters: another process "
            "changed shared parameters before its first update, a race or unsynchronised shared "
            "state)"
        )
    if divergence.first == "batch":
        # What picks a batch may be an RNG of the script's own (a random.Random or a NumPy
        # Generator seeded from the clock) that no record holds: not nondeterminism, as far as
        # the records can tell.
        return (
            f"{sentence}; same code, watched seeds, settings, input files and starting state: "
            "the batches differ from a source the records do not hold, an RNG twice does not "
            "watch (one the script makes and seeds from the clock or os.urandom) or a "
            "nondeterministic data pipeline (worker order, a race)"
        )
    return (
        f"{sentence}; same code, seeds, settings, input files and starting state, and "
        "everything before it in the step equal: nondeterminism inside the run (a "
        "nondeterministic kernel, a race or unsynchronised shared state)"
    )


def _names(env_changed: list[str]) -> str:
    """The first three variables the launches differed in, and how many more."""
    more = len(env_changed) - 3
    return ", ".join(env_changed[:3]) + (f" and {more} more" if more > 0 else "")


def _unrecorded_update(env_changed: list[str] | None) -> str:
    """The cause of parameters that differ first where the update's settings were not recorded
    (a loop that updates by hand: no optimizer whose learning rate twice reads)."""
    said = (
        "the cause cannot be named from what was recorded: the update's settings were not "
        "recorded (the loop updates by hand, with no optimizer whose learning rate twice reads)"
    )
    if env_changed:
        said += f"; the runs' environments differ in {_names(env_changed)}"
    return said


def _unrecorded_configuration(env_changed: list[str] | None) -> str:
    """The cause of a learning rate that differs with everything before it equal."""
    if env_changed:
        return (
            "the runs were configured differently: their environments differ in "
            f"{_names(env_changed)}, "
            "and a learning rate is set by the script, not computed by a kernel"
        )
    known = "" if env_changed is None else " (their environments were the same)"
    return (
        "the runs were configured differently in a way the manifest does not hold"
        f"{known}: a learning rate is set by the script, not computed by a kernel (a file read "
        "outside the recorded folders, the clock, the host, or a scheduler's state)"
    )
