"""Zero-code step capture: optimizer-step, backward and DataLoader hooks that feed the step trace.

A "step" is one round of optimizer updates: with one optimizer, one `step()` call; with several
(a GAN's discriminator and generator) the round ends when an optimizer that already stepped in it
steps again. Everything consumed in between (batches from DataLoader iterators, losses passed to
backward) belongs to that step. Loops without torch.optim call `Recorder.record_explicit` through
`twice.Run.step`, which then replaces the hooks for that process.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import operator
import os
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .digests import OPAQUE_TYPES, Digester, digest, digest_many, digest_pairs, float_bits, lanes_norm
from .seeding import capture_rng, rng_digests
from .trace import StepRecord, TraceWriter

__all__ = ["Recorder", "install", "active_recorder", "uninstall", "ReplicaDesync", "CAPTURE_ERROR"]

# Per-tensor digests are written every step for models with at most this many parameter tensors,
# else every AUTO_PARAMS_INTERVAL steps: names for a difference where it costs little space.
AUTO_PARAMS_TENSORS = 64
AUTO_PARAMS_INTERVAL = 100
PARAM_CHECK_EVERY = 10
SKIPPED_STREAK = 20  # consecutive recorded steps whose update GradScaler skipped, before the health log says so
CAPTURE_ERROR = "capture_error.json"  # in the run folder, when an error of twice's own stopped the step capture


_NOT_PAUSED = contextlib.nullcontext()  # what _paused() gives when no dispatch mode watches (reusable)


@dataclass
class _Round:
    """What the optimizers of the current step have contributed so far."""

    optimizers: list[int] = field(default_factory=list)
    grads: list[tuple[str, str]] = field(default_factory=list)
    params: list[tuple[str, str]] = field(default_factory=list)
    grad_squares: list[Any] = field(default_factory=list)
    lr: list[str] = field(default_factory=list)
    losses: list[Any] = field(default_factory=list)
    batch: Digester | None = None
    batch_count: int = 0
    rng: dict[str, str] = field(default_factory=dict)
    params_before: str | None = None
    param_norm: float | None = None
    grad_norms: list[float] = field(default_factory=list)
    grad_total: float | None = None  # the L2 norm of all gradients, from grad_norms
    params_digest: str | None = None
    skipped: bool = False  # an optimizer's update was skipped by GradScaler (inf/NaN gradients)


# optimizer -> (parameter id -> name, parameter id -> (id, class name) of its outermost module)
_PARAM_NAMES: "weakref.WeakKeyDictionary[Any, tuple[dict[int, str], dict[int, tuple[int, str]]]]" = weakref.WeakKeyDictionary()


def _param_names(optimizer) -> tuple[dict[int, str], dict[int, tuple[int, str]]]:
    """Name each parameter by its path from the outermost module holding it ("encoder.layer3.weight").

    One pass over live modules builds a child -> parent map, so naming costs O(modules) rather
    than calling named_parameters() on every submodule.
    """
    import torch

    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    module_type = torch.nn.Module
    # type() rather than isinstance(): isinstance can trigger lazy module attributes' warnings.
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), module_type)]
    parent: dict[int, tuple[Any, str]] = {}
    owner: dict[int, tuple[Any, str]] = {}
    for module in modules:
        for name, child in module._modules.items():
            if child is not None:
                parent.setdefault(id(child), (module, name))
        for name, param in module._parameters.items():
            if param is not None and id(param) in wanted:
                owner.setdefault(id(param), (module, name))
    names, roots = {}, {}
    for key, (module, name) in owner.items():
        parts, seen = [name], set()
        while id(module) in parent and id(module) not in seen:
            seen.add(id(module))
            module, child_name = parent[id(module)]
            parts.append(child_name)
        names[key], roots[key] = ".".join(reversed(parts)), (id(module), type(module).__name__)
    return names, roots


def _distinct(names: dict[int, str], roots: dict[int, tuple[int, str]], order: list[int], taken: set[str]) -> dict[int, str]:
    """Names from separate outermost modules can coincide (an encoder's and a decoder's "weight",
    or a GAN's two optimizers' models, `taken` holding the names given to the optimizers named
    before): those modules' names are then prefixed with their class ("Embedding.weight",
    "Linear.weight"), numbered in the optimizer's order where classes coincide too ("Linear#2.weight")."""
    counts: dict[str, int] = dict.fromkeys(taken, 1)
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    clashing = {roots[key][0] for key, name in names.items() if counts[name] > 1}
    if not clashing:
        return names
    labels: dict[int, str] = {}
    per_class: dict[str, int] = {}
    for key in order:
        if key not in roots or roots[key][0] not in clashing or roots[key][0] in labels:
            continue
        root, cls = roots[key]
        while True:  # not a prefix already given (to another optimizer's module of this class)
            per_class[cls] = per_class.get(cls, 0) + 1
            label = cls if per_class[cls] == 1 else f"{cls}#{per_class[cls]}"
            if not any(name.startswith(label + ".") for name in taken):
                break
        labels[root] = label
    out = {key: f"{labels[roots[key][0]]}.{name}" if roots[key][0] in labels else name for key, name in names.items()}
    used = set(taken)
    for key in order:  # a module could itself be called "Linear": number what still coincides
        if key in out:
            name, n = out[key], 1
            while out[key] in used:
                n += 1
                out[key] = f"{name}#{n}"
            used.add(out[key])
    return out


class ReplicaDesync(RuntimeError):
    """Data-parallel replicas hold different parameters (raised on purpose, to stop the run)."""


def _costed(method):
    """Adds the time spent in an event handler to the recorder's `cost` (what tracing costs the run)."""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.cost += time.perf_counter() - start

    return timed


def _guarded(method):
    """A zero-code event handler that never crashes the training it watches: an error of its own
    (a tensor it cannot read, a bug) stops the capture, with a warning and `capture_error.json` in
    the run folder naming the step and the error, and the training goes on; the trace holds the
    steps before it. What twice raises on purpose (a stop after --max-steps, a replica desync) passes.
    The time spent in it is added to the recorder's `cost` (one wrapper rather than two nested
    ones: each call here runs four times a step, on code the step has evicted from the caches)."""

    step_event = method.__name__ in ("pre_step", "post_step")
    name = method.__name__
    clock = time.perf_counter

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        start = clock()
        try:
            if step_event and not self._outermost(name, args[0]):
                return None
            if self.capture_error is not None:
                return self._count_only(name, args)
            try:
                return method(self, *args, **kwargs)
            except ReplicaDesync:
                raise
            except Exception as exc:  # noqa: BLE001 - the point: the user's training outlives our capture
                self._stop_capture(name, exc)
                return None
        finally:
            self.cost += clock() - start

    return guarded


class Recorder:
    """Turns hook events into StepRecords written to `trace[.<stream>].jsonl` in the run folder."""

    def __init__(self, run_dir: Path, *, trace_every: int = 1, params_every: int | None = None,
                 stop_after: int | None = None, stream: str | None = None, record_ops: Any = None):
        self.run_dir = Path(run_dir)
        self.trace_every = max(1, int(trace_every))
        self.params_every = params_every
        self.stop_after = stop_after
        self.stream = stream
        self.step_index = 0
        self.explicit = False
        self.stopped = False
        self._exit_pending = False
        self.pid = os.getpid()
        self._fork_count = 0
        self._t0 = time.perf_counter()
        self.cost = 0.0  # seconds spent in the event handlers below
        self._writer = TraceWriter(self.run_dir / (f"trace.{stream}.jsonl" if stream else "trace.jsonl"))
        self._round = _Round()
        self._pending_losses: list[Any] = []
        self._pending_batches: list[Digester] = []  # one digester per batch read since the last step
        self._round_size: int | None = None
        self._names: dict[int, list[tuple[str, Any]]] = {}
        self.on_stop: list = []  # called when stop_after is reached, before the process exits
        self.rng_at_stop: dict | None = None
        self.probe_params = os.environ.get("TWICE_RESUME_PROBE") == "1"
        self.record_ops: set[int] = set(record_ops or ())
        # TWICE_TRACE_STEPS: record only these steps (bisection replays fingerprint one step each)
        only = os.environ.get("TWICE_TRACE_STEPS")
        self.only_steps: set[int] | None = {int(x) for x in only.split(",") if x} if only else None
        # step -> op index whose outputs are saved (TWICE_DUMP_OP="STEP:INDEX", set by twice locate)
        self.dump_ops: dict[int, int] = {}
        dump = os.environ.get("TWICE_DUMP_OP")
        if dump:
            step, index = map(int, dump.split(":"))
            self.dump_ops[step] = index
        self._ops = None  # the OpRecorder of the step being recorded, if any
        self._op_log = None  # where recorded steps go: ops/ops[.<stream>].jsonl, opened on first use
        self._health = None
        # Replica consistency under torch.distributed: every N steps (TWICE_REPLICA_EVERY), stop or warn.
        self.replica_every = max(1, int(os.environ.get("TWICE_REPLICA_EVERY", "20")))
        self.replica_mode = os.environ.get("TWICE_REPLICA_MODE", "stop")
        self._norm_history: list[float] = []
        self._opt_index: dict[int, int] = {}
        self._replica_pending: tuple | None = None  # the replica check in flight
        self.capture_error: dict | None = None  # set when an error of our own stopped the capture
        self._stepping: int | None = None  # id of the optimizer whose step() is running (see _outermost)
        self.steps_seen = 0  # outermost optimizer steps ended (GradScaler.step compares it: see on_skipped_step)
        self._skipping = False
        self._skipped_streak = 0  # consecutive recorded steps whose update GradScaler skipped
        self._skipped_since = 0  # the first of them
        self._opaque_warned = len(OPAQUE_TYPES)  # types in batches already warned about (by an earlier recorder too)

    # -- events -----------------------------------------------------------------------------------
    @_guarded
    def on_batch(self, batch: Any) -> None:
        if self._exit_pending:  # (a check before the call: three events a step, traced or not)
            self._exit_if_stopping()
        self.set_phase("forward")
        if self.explicit or not self._tracing_this_step():
            return
        with self._paused():
            self._pending_batches.append(Digester(strict=False).update(batch))
        if len(OPAQUE_TYPES) > self._opaque_warned:
            self._warn_opaque()

    def _warn_opaque(self) -> None:
        import warnings

        names, self._opaque_warned = OPAQUE_TYPES[self._opaque_warned:], len(OPAQUE_TYPES)
        warnings.warn_explicit(f"twice: the batches hold {', '.join(names)}, which twice cannot read: the batch digest "
                               "covers its type only, so a difference in its contents goes unseen in the trace; yield "
                               "tensors, arrays, numbers, strings, or lists, dicts, dataclasses or plain objects of those",
                               RuntimeWarning, "twice", 0, module="twice")

    @_guarded
    def on_backward(self, tensors: Any) -> None:
        if self._exit_pending:
            self._exit_if_stopping()
        if self.explicit or not self._tracing_this_step():
            return
        if isinstance(tensors, _tensor_type[0]) and tensors.numel() == 1:
            self._pending_losses.append(tensors.detach())

    @_guarded
    def pre_step(self, optimizer, args, kwargs) -> None:
        if self._exit_pending:
            self._exit_if_stopping()
        if self.explicit:
            return
        if id(optimizer) in self._round.optimizers:
            if self._round_size is None:
                self._round_size = len(self._round.optimizers)
            self._finish_round()
        if self.probe_params and not self._round.optimizers:
            # The first step after a resume: record the parameters as loaded, to tell a model that
            # was not restored from an optimizer or RNG that was not.
            self.probe_params = False
            with self._paused():
                self._round.params_before = digest_pairs([(n, digest(p)) for n, p in self._named(optimizer)])
        # A torch.optim step's ops all come from the line calling step(); a user's own optimizer's have lines of their own.
        self.set_phase("optimizer", step_line_shared=type(optimizer).__module__.startswith("torch."))
        if self._tracing_this_step() and not _has_closure(args, kwargs):
            # Before the update: some optimizers (maximize=True) change the gradients in place.
            with self._paused():
                self._take_grads(optimizer)

    @_guarded
    def post_step(self, optimizer, args, kwargs) -> None:
        self.set_phase("forward")
        if self.explicit:
            return
        round_ = self._round
        round_.optimizers.append(id(optimizer))
        round_.skipped = round_.skipped or self._skipping
        if self._round_size is None and self.step_index + 1 in self.record_ops and self._ops is None:
            # The first round's end is only known when an optimizer repeats; with one optimizer
            # (the usual case) it ends here, so start recording the next step now.
            from .oplog import OpRecorder

            self._ops = OpRecorder(self.step_index + 1, dump_index=self.dump_ops.get(self.step_index + 1))
            self._ops.__enter__()
        with self._paused():
            self._post_step_record(optimizer, args, kwargs, round_)

    def _post_step_record(self, optimizer, args, kwargs, round_) -> None:
        if self._tracing_this_step():
            if _has_closure(args, kwargs):
                self._take_grads(optimizer)  # a closure (LBFGS) computes the gradients inside step()
            self._take_params(optimizer)
            round_.lr.extend(float_bits(float(group["lr"])) for group in optimizer.param_groups if "lr" in group)
            self._move_pending(round_)
            round_.rng = rng_digests()
        if self._round_size is not None and len(round_.optimizers) >= self._round_size:
            self._finish_round()

    def _check_replicas(self, round_: _Round) -> None:
        """Data-parallel ranks must hold identical parameters after each step: compare digests across ranks.

        The all-gather of each check is asynchronous and its result is read at the next step's
        check, so the collective's latency overlaps training instead of adding to it."""
        if self._replica_pending is None and self.step_index % self.replica_every:
            return  # neither a check to read nor one due (most steps: before any call into torch.distributed)
        dist = sys.modules.get("torch.distributed")  # loaded with torch; not re-imported every step
        if dist is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        self._resolve_replicas()
        if not round_.params or self.step_index % self.replica_every:
            return
        import torch

        # The 128-bit digest as two int64 words: a tensor all-gather, far cheaper than pickled objects.
        value = int(round_.params_digest, 16)
        words = [(value >> 64) & (2**64 - 1), value & (2**64 - 1)]
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        local = torch.tensor([w - 2**64 if w >= 2**63 else w for w in words], dtype=torch.int64, device=device)
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        work = dist.all_gather(parts, local, async_op=True)
        self._replica_pending = (work, parts, self.step_index, dict(round_.params))

    def _resolve_replicas(self) -> None:
        """Read the result of the check in flight, if any; on a desync stop (or warn) naming step, rank and tensor."""
        pending, self._replica_pending = self._replica_pending, None
        if pending is None:
            return
        import torch.distributed as dist

        work, parts, step, table = pending
        work.wait()
        gathered = [tuple(p.tolist()) for p in parts]
        if len(set(gathered)) == 1:
            return
        # Desync: name the first rank that differs from rank 0, and its first differing tensor.
        tables = [None] * dist.get_world_size()
        dist.all_gather_object(tables, table)
        bad_rank = next(r for r, d in enumerate(gathered) if d != gathered[0])
        tensor = next((name for name in tables[0] if tables[bad_rank].get(name) != tables[0][name]), None)
        since = "" if self.replica_every == 1 else f" (the check at step {step - self.replica_every} agreed)"
        message = (f"replicas out of sync at step {step}: rank {bad_rank} holds different parameters "
                   f"from rank 0, first in {tensor}{since}")
        from .files import write_json_atomic

        if dist.get_rank() == 0:
            write_json_atomic(self.run_dir / "replicas.json", {"step": step, "rank": bad_rank, "tensor": tensor,
                                                                "message": message})
        if self.replica_mode == "stop":
            raise ReplicaDesync(f"twice: {message}")
        import warnings

        warnings.warn(f"twice: {message}", RuntimeWarning, stacklevel=2)

    @_costed
    def record_explicit(self, *, loss: Any = None, batch: Any = None, params: list[tuple[str, Any]] | None = None) -> None:
        """One step from a hand-written loop: the given loss, batch and named parameters (with .grad)."""
        import torch

        self._exit_if_stopping()
        self.explicit = True
        if self._tracing_this_step():
            round_ = _Round()
            if loss is not None:
                round_.losses.append(loss.detach() if isinstance(loss, torch.Tensor) else float(loss))
            if batch is not None:
                round_.batch = Digester(strict=False).update(batch)
                round_.batch_count = 1
                if len(OPAQUE_TYPES) > self._opaque_warned:
                    self._warn_opaque()
            named = list(params or [])
            with_grads = [(name, param.grad) for name, param in named if param.grad is not None]
            digests, norms = self._digests([grad for _, grad in with_grads], True)
            round_.grads.extend((name, value) for (name, _), value in zip(with_grads, digests))
            round_.grad_squares.extend(norms)
            param_digests, _ = self._digests([param for _, param in named], False)
            round_.params.extend((name, value) for (name, _), value in zip(named, param_digests))
            round_.rng = rng_digests()
            self._round = round_
            self._write_round()
        self._advance()

    def _stop_capture(self, handler: str, exc: Exception) -> None:
        import traceback
        import warnings

        from .files import write_json_atomic

        self.capture_error = {"step": self.step_index, "handler": handler, "error": f"{type(exc).__name__}: {exc}",
                              "traceback": traceback.format_exc()}
        self._round, self._pending_losses, self._pending_batches = _Round(), [], []  # the step cut short is not written
        try:
            self._writer.close()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.run_dir / CAPTURE_ERROR, self.capture_error)
        except OSError:
            pass
        # Placed at "twice" rather than at a line of the hook machinery, which would say nothing useful.
        warnings.warn_explicit(f"twice: step capture stopped at step {self.step_index}: {type(exc).__name__}: {exc}; "
                               f"the training goes on untraced (the trace holds steps 0-{self.step_index - 1}; "
                               f"details in {self.run_dir / CAPTURE_ERROR})", RuntimeWarning, "twice", 0, module="twice")

    def _outermost(self, event: str, optimizer) -> bool:
        """Is this step event an outermost optimizer's? An optimizer that steps inside another's
        step (Lookahead's or SAM's base optimizer, ZeroRedundancyOptimizer's local one) is part
        of that step: recording it too would count its gradients twice in the norm. (If an outer
        step raised, its pre event is not closed: its next step starts afresh.)"""
        key = id(optimizer)
        if event == "pre_step":
            if self._stepping is not None and self._stepping != key:
                return False
            self._stepping = key
            return True
        if self._stepping is not None and self._stepping != key:
            return False
        self._stepping = None
        self.steps_seen += 1
        return True

    def on_skipped_step(self, optimizer) -> None:
        """GradScaler.step() found inf/NaN gradients and skipped `optimizer.step()`: the iteration
        still ran (a batch, a loss, gradients), so it is still a step, recorded with `skipped`, its
        parameters unchanged. Without this, a skipped iteration's batch and loss would be merged
        into the next step's record and the step count (--max-steps, resume) would drift from the
        loop's iterations: in fp16 training the first few steps are routinely skipped."""
        self._skipping = True
        try:
            self.pre_step(optimizer, (optimizer,), {})
            self.post_step(optimizer, (optimizer,), {})
        finally:
            self._skipping = False

    def _count_only(self, event: str, args: tuple) -> None:
        """After the capture stopped nothing is recorded, but with a step limit (--max-steps, the
        re-run of `verify --steps`, verify-resume's interrupted run) optimizer rounds are still
        counted, so that the run still ends where it was asked to rather than training on."""
        if self.stop_after is None or self.explicit or os.getpid() != self.pid:
            return
        self._exit_if_stopping()
        optimizers = self._round.optimizers
        if event == "pre_step" and id(args[0]) in optimizers:
            self._round_size = self._round_size or len(optimizers)
        elif event == "post_step":
            optimizers.append(id(args[0]))
            if self._round_size is None or len(optimizers) < self._round_size:
                return
        else:
            return
        self._round = _Round()
        self._advance()

    # -- pieces -----------------------------------------------------------------------------------
    def _tracing_this_step(self) -> bool:
        if self.only_steps is not None:
            return self.step_index in self.only_steps
        return self.step_index % self.trace_every == 0

    def _named(self, optimizer) -> list[tuple[str, Any]]:
        key = id(optimizer)
        groups = optimizer.param_groups
        count = len(groups[0]["params"]) if len(groups) == 1 else sum(len(group["params"]) for group in groups)
        cached = self._names.get(key)
        if cached is None or len(cached) != count:  # add_param_group() invalidates the cache
            index = self._opt_index.setdefault(key, len(self._opt_index))
            found = _PARAM_NAMES.get(optimizer)
            if found is None or len(found[0]) < count:
                found = _param_names(optimizer)  # a scan of live objects: once per optimizer and process
                try:
                    _PARAM_NAMES[optimizer] = found
                except TypeError:
                    pass  # an optimizer-like object that takes no weak references
            taken = {name for other, named in self._names.items() if other != key for name, _ in named}
            names = _distinct(*found, [id(p) for group in optimizer.param_groups for p in group["params"]], taken)
            self._names[key] = [
                (names.get(id(param)) or f"optimizer{index}.group{g}.param{p}", param)
                for g, group in enumerate(optimizer.param_groups) for p, param in enumerate(group["params"])
            ]
        return self._names[key]

    def _take_grads(self, optimizer) -> None:
        names, grads = [], []
        for name, param in self._named(optimizer):
            if param.grad is not None:
                names.append(name)
                grads.append(param.grad)
        digests, norms = self._digests(grads, True)
        self._round.grads.extend(zip(names, digests))
        self._round.grad_squares.extend(norms)

    def _digests(self, tensors: list, norms: bool) -> tuple[list[str], list]:
        """Digests of tensors and, with `norms`, their L2 norms (floats on the CPU, 0-d tensors on an
        accelerator): on the CPU through digests.digest_many, one pass over each tensor's bytes."""
        if self._ops is None:
            digests, found = digest_many(tensors, norms)
        else:  # an op-recorded step: through the op log's cache (the same values: both use digest_tensor)
            digests, found = [self._ops.digest(t) for t in tensors], [lanes_norm(t) for t in tensors] if norms else None
        if not norms:
            return digests, []
        missing = [i for i, norm in enumerate(found) if norm is None]  # not float32/64 on the CPU: torch's
        for i, norm in zip(missing, _norms([tensors[i] for i in missing])):
            found[i] = norm
        return digests, found

    def _take_params(self, optimizer) -> None:
        named = self._named(optimizer)
        # Their norms too, every PARAM_CHECK_EVERY steps: inf or NaN iff some parameter is (cheap
        # health check). Between checks, a non-finite update shows in the learning rate (checked
        # every step) or in the next step's loss and gradients.
        # (map and zip over itemgetters: no generator to resume per tensor, on cold caches)
        digests, norms = self._digests(list(map(_second, named)), self.step_index % PARAM_CHECK_EVERY == 0)
        self._round.params.extend(zip(map(_first, named), digests))
        if norms:
            norms = _floats(norms)
            total = math.sqrt(sum(map(operator.mul, norms, norms)))
            self._round.param_norm = total if self._round.param_norm is None else math.hypot(self._round.param_norm, total)

    def _move_pending(self, round_: _Round) -> None:
        round_.losses.extend(self._pending_losses)
        self._pending_losses = []
        for digester in self._pending_batches:
            if round_.batch is None:
                round_.batch = digester
            else:
                round_.batch.update(digester.hexdigest())
        round_.batch_count += len(self._pending_batches)
        self._pending_batches = []

    def _finish_round(self) -> None:
        if not self._round.optimizers:
            return
        if self._tracing_this_step():
            self._write_round()
            with self._paused():
                self._check_replicas(self._round)
        self._round = _Round()
        self._advance()

    # -- op-level recording of chosen steps ------------------------------------------------------
    def start_ops_if_chosen(self) -> None:
        if self.step_index in self.record_ops and self._ops is None and os.getpid() == self.pid:
            from .oplog import OpRecorder

            self._ops = OpRecorder(self.step_index, dump_index=self.dump_ops.get(self.step_index))
            self._ops.__enter__()

    def stop_ops(self) -> None:
        if self._ops is not None and self._ops.step <= self.step_index:
            ops, self._ops = self._ops, None
            ops.__exit__(None, None, None)
            ops.close()
            if self._op_log is None:
                from .oplog import OpLog

                self._op_log = OpLog(self.run_dir, self.stream)
            ops.write(self._op_log)

    def _modes(self) -> list:
        """The dispatch modes watching the user's ops: the op log of this step, the numerics watch."""
        watch = _numerics_watch()
        if self._ops is None:
            return [watch] if watch is not None else []
        return [self._ops, watch] if watch is not None else [self._ops]

    def _paused(self):
        """Our own tensor work (digests, norms) is not part of the user's step: keep it out of op logs."""
        modes = self._modes()
        if not modes:
            return _NOT_PAUSED

        @contextlib.contextmanager
        def paused():
            for mode in modes:
                mode.paused = True
            try:
                yield
            finally:
                for mode in modes:
                    mode.paused = False

        return paused()

    def set_phase(self, phase: str, step_line_shared: bool = False) -> None:
        if self._ops is None:  # five times a step, mostly with no mode watching: no list built
            watch = _numerics_watch()
            if watch is not None:
                watch.set_phase(phase, step_line_shared)
            return
        for mode in self._modes():
            mode.set_phase(phase, step_line_shared)

    def resume_at(self, step: int, *, keep_batches: int | None = 0) -> None:
        """Continue numbering at `step` (after a checkpoint restore); the open round is dropped.

        `keep_batches` keeps that many of the batches read last: a framework that fetches the
        resumed step's batches before it restores state (Lightning, the Hugging Face Trainer) has
        read them already, after any it skipped to reach the resumed position. None keeps them all."""
        self.step_index = step
        self._round = _Round()
        self._pending_losses = []
        if keep_batches is not None:
            self._pending_batches = self._pending_batches[-keep_batches:] if keep_batches > 0 else []

    def _advance(self) -> None:
        self.stop_ops()
        self.step_index += 1
        self.start_ops_if_chosen()
        if self.stop_after is not None and self.step_index >= self.stop_after and not self.stopped:
            self.stopped = True
            self._writer.close()
            # Leave at the next event (the next batch, backward or step), not inside this step:
            # the loop finishes its bookkeeping first (scheduler.step(), its own checkpoint). The
            # RNGs are taken now, as the step ends: before the next event the loop may already
            # have drawn from them (input noise, dropout, a new epoch's DataLoader iterator).
            self.rng_at_stop = capture_rng()
            self._exit_pending = True

    def _exit_if_stopping(self) -> None:
        if self._exit_pending and os.getpid() == self.pid:
            self._exit_pending = False
            for callback in self.on_stop:
                callback()  # twice.Run checkpoints here: between two steps
            # Through normal interpreter exit, so that atexit handlers record the process.
            raise SystemExit(0)

    def _write_round(self) -> None:

        round_ = self._round
        loss_values = _floats(round_.losses)
        losses = [float_bits(x) for x in loss_values]
        round_.params_digest = digest_pairs(round_.params) if round_.params else None
        # One device-to-host read of each gradient norm, shared by the record and the health checks.
        norms = round_.grad_norms = _floats(round_.grad_squares)
        round_.grad_total = math.sqrt(sum(map(operator.mul, norms, norms))) if norms else None  # the squares in order
        per_tensor = self._per_tensor_due(len(round_.params))
        record = StepRecord(
            step=self.step_index,
            loss=None if not losses else losses[0] if len(losses) == 1 else losses,
            batch=round_.batch.hexdigest() if round_.batch is not None else None,
            grads=digest_pairs(round_.grads) if round_.grads else None,
            grad_norm=float_bits(round_.grad_total) if norms else None,
            lr=round_.lr,
            params=round_.params_digest,
            rng=round_.rng,
            params_before=round_.params_before,
            skipped=True if round_.skipped else None,
            param_digests=dict(round_.params) if per_tensor and round_.params else None,
            grad_digests=dict(round_.grads) if per_tensor and round_.grads else None,
            time=round(time.perf_counter() - self._t0, 6),
        )
        self._writer.write(record)
        self._check_health(record, round_, loss_values)

    def _check_health(self, record: StepRecord, round_: _Round, losses: list[float]) -> None:
        """The cheap always-on numerics mode: loss, gradients and parameters, once per step."""
        if self._health is None:
            from .numerics import Event, HealthLog

            self._health, self._event = HealthLog(self.run_dir), Event  # imported once, not every step
        log, step, Event = self._health, record.step, self._event
        if not all(map(math.isfinite, losses)):
            log.add(Event("non_finite", step, f"loss is {losses[0]} at step {step}"))
        elif losses and all(x == 0.0 for x in losses):
            log.add(Event("loss_zero", step, f"loss exactly 0 at step {step}"))
        norms, total = round_.grad_norms, round_.grad_total
        if round_.skipped:
            # GradScaler's own answer to inf/NaN gradients (routine for the first fp16 steps) is not
            # a fault; a long streak of them is: the parameters have stopped changing.
            if not self._skipped_streak:
                self._skipped_since = step
            self._skipped_streak += 1  # of recorded steps (one in N under --trace-every N)
            if self._skipped_streak == SKIPPED_STREAK:
                log.add(Event("skipped_updates", step, f"GradScaler skipped the update at {SKIPPED_STREAK} "
                              f"consecutive recorded steps ({self._skipped_since}-{step}): the gradients are inf/NaN "
                              "at every loss scale tried, and the parameters have not changed since"))
            norms = []
        else:
            self._skipped_streak = 0
        if norms:
            if not math.isfinite(total):
                log.add(Event("non_finite", step, f"gradients non-finite at step {step}"))
            else:
                zero = [name for (name, _), n in zip(round_.grads, norms) if n == 0.0] if 0.0 in norms else None
                if zero:
                    log.add(Event("zero_grad", step, f"gradients exactly zero: {', '.join(zero[:6])}" + (" ..." if len(zero) > 6 else ""),
                                  details={"parameters": zero}), key=("zero_grad", tuple(zero)))
                history = self._norm_history
                # The median only when the norm is over 1000x the smallest recent one (it is then at least as large).
                median = sorted(history)[len(history) // 2] if len(history) >= 10 and total > 1e3 * min(history) else None
                if median is not None and total > 1e3 * median:
                    log.add(Event("grad_explosion", step, f"gradient norm {total:.3g} at step {step}, "
                                  f"over 1000x the recent median {median:.3g}"))
                history.append(total)
                del history[:-50]
        if "n" in "".join(round_.lr):  # float_bits' "inf", "-inf", "nan:..." (a finite value's hex has no n)
            log.add(Event("bad_scalar", step, f"learning rate non-finite at step {step}: {', '.join(round_.lr)}"))
        if round_.param_norm is not None and not math.isfinite(round_.param_norm):
            log.add(Event("non_finite", step, f"parameters non-finite after the update at step {step}"))

    def _per_tensor_due(self, tensors: int) -> bool:
        every = self.params_every
        if every is None:
            every = 1 if tensors <= AUTO_PARAMS_TENSORS else AUTO_PARAMS_INTERVAL
        return every > 0 and self.step_index % every == 0

    def finish(self) -> None:
        """Write the step still open (the last one) and close the trace."""
        if os.getpid() != self.pid:
            return
        self.stop_ops()
        if self._op_log is not None:
            self._op_log.close()
        if not self.explicit and self._round.optimizers and not self.stopped and self.capture_error is None:
            if self._tracing_this_step():
                self._write_round()
            self._round = _Round()
        self._writer.close()
        if self._replica_pending is not None:
            import torch.distributed as dist

            try:
                if dist.is_initialized():
                    self._resolve_replicas()  # the last check, unless the process group is gone already
            except RuntimeError as exc:
                print(exc, file=sys.stderr, flush=True)
            self._replica_pending = None

    def _after_fork_in_child(self, index: int) -> None:
        # A forked process (Hogwild worker, DataLoader worker) records into a stream of its own,
        # named by fork order so that two runs name their processes alike.
        self.pid = os.getpid()
        self.stream = f"{self.stream + '.' if self.stream else ''}fork{index}"
        self._writer = TraceWriter(self.run_dir / f"trace.{self.stream}.jsonl")
        self._op_log = None  # the parent's handle is the parent's: this process logs to its own stream
        self._round, self._pending_losses, self._pending_batches = _Round(), [], []
        self._fork_count = 0
        self.step_index = 0


_NUMERICS = __package__ + ".numerics"
_numerics_module: list[Any] = []  # twice.numerics, once something has loaded it


def _numerics_watch():
    """The numerics watch in force, if any (without importing twice.numerics, which nothing may use)."""
    if not _numerics_module:
        module = sys.modules.get(_NUMERICS)
        if module is None:
            return None
        _numerics_module.append(module)
    return _numerics_module[0]._active  # (what its active_watch() returns: a call fewer, five times a step)


_first, _second = operator.itemgetter(0), operator.itemgetter(1)


def _norm(grad):
    """The L2 norm of one gradient (kept as a tensor: no device sync until the record is written);
    of a sparse one, the norm of its values once duplicates are summed (what the dense tensor has)."""
    import torch

    grad = grad.detach()
    if grad.layout == torch.sparse_coo:
        grad = grad.coalesce().values()
    elif grad.layout != torch.strided:
        grad = grad.values()  # compressed layouts hold no duplicates
    return torch.linalg.vector_norm(grad)


def _norms(grads: list) -> list:
    """L2 norms of many tensors: on the CPU as Python floats, one `vector_norm` each; on an
    accelerator as 0-d tensors from one fused call (any mix of dtypes and devices: where the fused
    kernel cannot take them, torch loops over them itself), read later in one device-to-host copy.

    The CPU path is the step trace's hot spot on small models: it runs once per step on code and
    data the step has just evicted from the CPU caches, where a torch.no_grad() block, the fused
    call's own loop and a float() per 0-d tensor cost more than the norms themselves (measured in
    the training loop: 150 us against 86 us a step for a small CNN). Same values either way:
    `_foreach_norm` computes each norm with `linalg.vector_norm` (a test holds them together)."""
    import torch

    if not grads:
        return []
    strided = torch.strided
    if all(g.is_cpu and g.layout is strided for g in grads):
        vector_norm = torch.linalg.vector_norm
        if any(g.requires_grad for g in grads):  # parameters (or gradients made with create_graph)
            with torch.no_grad():
                return [float(vector_norm(g)) for g in grads]
        return [float(vector_norm(g)) for g in grads]
    foreach_norm = getattr(torch, "_foreach_norm", None)
    if foreach_norm is not None:
        with torch.no_grad():  # rather than a detach() per tensor: one op each under an op log
            try:
                return list(foreach_norm(grads))
            except (RuntimeError, TypeError):
                pass
    return [_norm(g) for g in grads]


def _floats(values: list) -> list[float]:
    """Python floats of 0-d tensors (and numbers): one device-to-host read where they share an accelerator."""
    import torch

    if len(values) > 1 and all(isinstance(v, torch.Tensor) for v in values) and not values[0].is_cpu and \
            len({(v.device, v.dtype) for v in values}) == 1:
        return torch.stack(values).tolist()
    return [float(v) for v in values]  # on the CPU, a float() each costs less than stacking them first


def _has_closure(args, kwargs) -> bool:
    # Step hooks receive the bound call's arguments: args[0] is the optimizer itself.
    return (len(args) > 1 and callable(args[1])) or (bool(kwargs) and callable(kwargs.get("closure")))


_recorder: Recorder | None = None
_handles: list[Any] = []
_scaler_depth = [0]  # GradScaler.step calls in progress (see install)
_tensor_type: list[type] = [type("_NoTensor", (), {})]  # [torch.Tensor] once torch is loaded (import statements cost, cold)
_originals: dict[str, Any] = {}


def active_recorder() -> Recorder | None:
    return _recorder


def _before_fork() -> None:
    if _recorder is not None:
        _recorder._fork_count += 1


def _after_fork_child() -> None:
    if _recorder is not None:
        _recorder._after_fork_in_child(_recorder._fork_count)


def _pre_step(optimizer, args, kwargs) -> None:
    recorder = _recorder
    if recorder is not None:
        recorder.pre_step(optimizer, args, kwargs)


def _post_step(optimizer, args, kwargs) -> None:
    recorder = _recorder
    if recorder is not None:
        recorder.post_step(optimizer, args, kwargs)


def _backward_starts(tensors) -> Recorder | None:
    recorder = _recorder
    if recorder is not None:
        recorder.on_backward(tensors)
        recorder.set_phase("backward")
    return recorder


def _backward_ends(recorder: Recorder) -> None:
    recorder.set_phase("user")  # between backward and the optimizer: gradient edits, clipping


def _batch_read(batch) -> None:
    recorder = _recorder
    if recorder is not None:
        recorder.on_batch(batch)


def _step_skipped(recorder: Recorder, optimizer) -> None:
    if recorder is _recorder:
        recorder.on_skipped_step(optimizer)


class _Calls:
    """What the patched torch entry points call into. Plain functions until the program compiles
    (torch.compile); then each is wrapped in torch.compiler.disable, so that Dynamo, tracing an
    optimizer step, a backward call or a batch read in the user's compiled code, runs twice's
    handlers eagerly, as a graph break, instead of tracing into the digests and norms (which
    broke the user's graph at each of them and compiled twice's own functions, once per tensor,
    up to the recompile limit). Not wrapped before: the wrapper costs ~0.5 us a call warm, and
    some 30 us a call in a training loop, cold (see _compiling_already)."""

    pre_step = staticmethod(_pre_step)
    post_step = staticmethod(_post_step)
    backward_starts = staticmethod(_backward_starts)
    backward_ends = staticmethod(_backward_ends)
    batch_read = staticmethod(_batch_read)
    step_skipped = staticmethod(_step_skipped)
    compiled = False


def _register_step_hooks() -> None:
    import torch.optim.optimizer as optimizer_module

    _handles.append(optimizer_module.register_optimizer_step_pre_hook(_Calls.pre_step))
    _handles.append(optimizer_module.register_optimizer_step_post_hook(_Calls.post_step))


def _compile_safe() -> None:
    """Hide twice's handlers from Dynamo (see _Calls): once, when the program first compiles."""
    if _Calls.compiled:
        return
    import torch

    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        return
    for name in ("pre_step", "post_step", "backward_starts", "backward_ends", "batch_read", "step_skipped"):
        setattr(_Calls, name, staticmethod(disable(getattr(_Calls, name))))
    _Calls.compiled = True
    if _handles:  # the step hooks hold the functions themselves: register the wrapped ones
        for handle in _handles:
            handle.remove()
        _handles.clear()
        _register_step_hooks()


def _compiling_already() -> bool:
    """Has the program set up a compilation (torch.compile) before twice installed? Not merely
    imported Dynamo: torch imports it for its own use (the first optimizer built does), and the
    wrapper _compile_safe puts around each handler costs about a fifth of what tracing a small
    CNN's step costs (set_eval_frame four times, cold, five calls a step). Each compilation context
    Dynamo builds records its backend in eval_frame.cached_backends; its own disable contexts
    record None. A torch without that record: assume it may. (A program that compiled, then
    called torch._dynamo.reset(), then installed, goes unwrapped: reset forgets its backends.)"""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    backends = getattr(eval_frame, "cached_backends", None)
    if not isinstance(backends, dict):
        return True
    return any(backend is not None for backend in list(backends.values()))


def install(recorder: Recorder) -> Recorder:
    """Route optimizer steps, backward calls and DataLoader batches of this process to `recorder`."""
    global _recorder
    import torch
    from torch.utils.data import dataloader

    if _recorder is not None:
        uninstall()
    _recorder = recorder
    _tensor_type[0] = torch.Tensor
    if _compiling_already():
        _compile_safe()
    _register_step_hooks()

    original_backward = torch.autograd.backward
    original_next = dataloader._BaseDataLoaderIter.__next__
    original_compile = torch.compile
    _originals.update(backward=original_backward, next=original_next, compile=original_compile)

    def backward(tensors, *args, **kwargs):
        recorder = _Calls.backward_starts(tensors)
        try:
            return original_backward(tensors, *args, **kwargs)
        finally:
            if recorder is not None:
                _Calls.backward_ends(recorder)

    def next_batch(self):
        batch = original_next(self)
        _Calls.batch_read(batch)
        return batch

    @functools.wraps(original_compile)
    def compile(*args, **kwargs):
        _compile_safe()
        return original_compile(*args, **kwargs)

    torch.autograd.backward = backward
    dataloader._BaseDataLoaderIter.__next__ = next_batch
    torch.compile = compile
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_class is not None:
        original_scaler_step = scaler_class.step
        _originals.update(scaler_step=(scaler_class, original_scaler_step))

        @functools.wraps(original_scaler_step)
        def scaler_step(self, optimizer, *args, **kwargs):
            recorder = _recorder
            if recorder is None or _scaler_depth[0]:
                return original_scaler_step(self, optimizer, *args, **kwargs)
            seen = recorder.steps_seen
            _scaler_depth[0] += 1  # a subclass's step() calling this one is one step
            try:
                result = original_scaler_step(self, optimizer, *args, **kwargs)
            finally:
                _scaler_depth[0] -= 1
            if recorder.steps_seen == seen:
                _Calls.step_skipped(recorder, optimizer)
            return result

        scaler_class.step = scaler_step
    recorder.start_ops_if_chosen()
    if not _originals.get("fork_hook"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_child)
        _originals["fork_hook"] = True
    return recorder


def uninstall() -> None:
    """Remove the hooks and close the recorder's trace."""
    global _recorder
    import torch
    from torch.utils.data import dataloader

    if _recorder is not None:
        _recorder.finish()
    _recorder = None
    for handle in _handles:
        handle.remove()
    _handles.clear()
    if "backward" in _originals:
        torch.autograd.backward = _originals.pop("backward")
        dataloader._BaseDataLoaderIter.__next__ = _originals.pop("next")
        torch.compile = _originals.pop("compile")
    if "scaler_step" in _originals:
        scaler_class, original = _originals.pop("scaler_step")
        scaler_class.step = original
