"""The dispatch mode that routes a program's operations to portable kernels, unmodified.

A `TorchDispatchMode` sees every aten operation below autograd: the forward, the backward (autograd
decomposes it into aten operations too), the optimizer's update and the initialisation. Each
operation is routed by rules (routes.py): computed by twice's kernel, left to torch when torch's
bits already depend on the inputs alone (a view, an exact operation, no floating-point tensor),
decomposed by PyTorch's own tables into operations routed in turn, or uncovered: under "strict"
an error naming the operation, the module and the user's line; under "warn" one warning per
operation, the operation listed for the manifest, and torch's result.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import twice.portable.ops.attention  # noqa: F401  (each kernel module fills table.KERNELS)
import twice.portable.ops.embedding  # noqa: F401
import twice.portable.ops.fft  # noqa: F401
import twice.portable.ops.functions  # noqa: F401
import twice.portable.ops.gridsample  # noqa: F401
import twice.portable.ops.linalg  # noqa: F401
import twice.portable.ops.linear  # noqa: F401
import twice.portable.ops.logs  # noqa: F401
import twice.portable.ops.losses  # noqa: F401
import twice.portable.ops.math  # noqa: F401
import twice.portable.ops.network  # noqa: F401
import twice.portable.ops.optim  # noqa: F401
import twice.portable.ops.orthogonal  # noqa: F401
import twice.portable.ops.products  # noqa: F401
import twice.portable.ops.random  # noqa: F401
import twice.portable.ops.resample  # noqa: F401
import twice.portable.ops.rules  # noqa: F401
import twice.portable.ops.segments  # noqa: F401
import twice.portable.ops.special  # noqa: F401
import twice.portable.ops.spectral  # noqa: F401
from twice.core.errors import DeterminismError
from twice.core.escaping import escape_controls
from twice.portable import native
from twice.portable.dispatch import half, operands, routes, switches, table
from twice.portable.dispatch.table import COMPLEX_KERNELS, PortableUnsupported
from twice.portable.ops import recurrent
from twice.record import callsite

__all__ = ["PortableMode", "PortableError", "enable", "disable", "entered", "active"]
__all__ += ["coverage"]


class PortableError(DeterminismError):
    """An operation portable mode does not cover ran under `--determinism strict`."""

    def __str__(self) -> str:  # raised inside the user's program: its traceback shows the hint
        return self.message + (f"\nhint: {self.hint}" if self.hint else "")


def coverage(func) -> str:
    """How an aten overload is covered before looking at its arguments (routes.coverage)."""
    return routes.coverage(func)


_SEEDED = torch.Tag.nondeterministic_seeded
_ROUTES: dict = {}  # aten overload -> routes.route(overload)
# Kernels that make floating-point values from no floating-point tensor (random draws, ranges).
_FACTORIES = ("rand", "random_", "normal.", "arange.", "linspace.", "logspace.")
_decomposing = threading.local()  # the overloads whose decomposition runs in this thread


class PortableMode(TorchDispatchMode):
    """Portable kernels for every covered operation; `policy` ("strict" or "warn") for the rest."""

    live = True  # routes operations (a thread's mode left from a disabled `enable` does not)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in Dynamo's `disable` (a few microseconds on
        # every operation, and an import of torch._dynamo on the first) unless the mode says
        # no; under portable mode Dynamo is off altogether (switches.compile_eagerly).
        return False

    def __init__(self, policy: str = "strict") -> None:
        super().__init__()
        native.keep_memory()
        self.policy = policy
        self.uncovered: dict[str, dict[str, Any]] = {}
        self.compiled = 0  # torch.compile calls run eagerly (switches.compile_eagerly)
        self._thread = threading.local()  # .depth: this thread's entries of the mode, nested
        self.undo_compile = lambda: None
        self.counts: dict[str, int] = {}

    def __enter__(self):
        # torch settings that would choose other operations or other roundings (switches.py):
        # the mode enters again around its own operations many times a step, so only this
        # thread's outermost entry sets them and its exit restores them
        depth = getattr(self._thread, "depth", 0)
        if not depth:
            switches.enter(PortableMode)
            self._thread.flushing = switches.stop_flushing()
            recurrent.install(PortableMode)  # nn.LSTM as one portable operation per layer
        self._thread.depth = depth + 1
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._thread.depth -= 1
            if not self._thread.depth:
                switches.resume_flushing(self._thread.flushing)
                switches.leave()
                recurrent.uninstall()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        route = _ROUTES.get(func)
        if route is None:
            route = _ROUTES[func] = routes.route(func)
        kind, handler, name = route
        kwargs = kwargs or {}
        if kind == routes.EXACT_ROUTE:
            if handler is routes.METADATA:  # reads no value (a sparse tensor's nnz, its flags)
                return func(*args, **kwargs)
            unusual = operands.unusual(args, kwargs)
            if handler:  # a view, or exact on complex tensors too: an uncoalesced one matters
                unusual &= operands.LOOSE
            if not unusual:
                return func(*args, **kwargs)
            if unusual & operands.LOOSE:
                why = "a sparse tensor that is not coalesced: torch adds its duplicates"
                return self._uncovered(func, name, args, kwargs, why)
            complex_kernel = COMPLEX_KERNELS.get(name)  # a complex tensor times a real number
            try:
                if complex_kernel is not None:
                    return complex_kernel(*args, **kwargs)
            except PortableUnsupported as exc:
                return self._uncovered(func, name, args, kwargs, str(exc))
            return self._uncovered(func, name, args, kwargs, "complex arithmetic")
        if kind == routes.KERNEL:
            found = operands.scan(args, kwargs)
            if not found & operands.INEXACT_ANY:  # a seeded op is Philox's, of any dtype
                if not (name.startswith(_FACTORIES) or _SEEDED in func.tags):
                    return self._integers(func, types, args, kwargs)
            if found & operands.COMPLEX_T and handler not in table.COMPLEX_TAKING:
                return self._uncovered(func, name, args, kwargs, "complex arithmetic")
            if found & operands.SPARSE:
                if handler not in table.SPARSE_KERNELS:
                    return self._uncovered(func, name, args, kwargs, "a sparse tensor")
                if operands.unusual(args, kwargs) & operands.LOOSE:
                    why = "a sparse tensor that is not coalesced: its duplicates would be added"
                    return self._uncovered(func, name, args, kwargs, why)
            if found and not found & operands.VALUES and _SEEDED not in func.tags:
                # Every floating-point operand is empty: an empty result computed no value; one
                # with values (a sum's 0, histogram edges from a range) is the kernel's.
                result = func(*args, **kwargs)
                if not operands.scan((result,), None) & operands.VALUES:
                    return result
            try:
                operands.check_dims(func, args, kwargs)  # torch's IndexError, not another dim
                if (check := getattr(handler, "precheck", None)) is not None:
                    check(*args, **kwargs)  # a kernel's own check on its arguments
                if handler in table.COMPOSITE:  # torch operations, each routed by this mode
                    with self:
                        return handler(*args, **kwargs)
                if found & operands.HALF:
                    return half.run(func, handler, args, kwargs)
                return handler(*args, **kwargs)
            except PortableUnsupported as exc:
                return self._uncovered(func, name, args, kwargs, str(exc))
        if kind == routes.FOREACH:
            return self._foreach(func, name, args, kwargs)
        if kind == routes.INDEX_PUT:
            if (args[3:4] or [kwargs.get("accumulate")])[0]:
                return self._uncovered(func, name, args, kwargs, "accumulating index_put")
            return func(*args, **kwargs)
        if not operands.scan(args, kwargs) and _SEEDED not in func.tags:
            return self._integers(func, types, args, kwargs)
        if kind == routes.PRIM:
            with self:
                return handler(*args, **kwargs)
        if kind == routes.DECOMPOSED:
            return self._decomposed(func, handler, name, args, kwargs)
        if kind == routes.OUT:
            out = kwargs.pop("out")
            if kwargs.get("dtype") is None and operands.takes_dtype(handler):
                kwargs["dtype"] = out.dtype  # the result's dtype is out's (linspace(out=f64))
            with self:
                result = handler(*args, **kwargs)
            out.resize_(result.shape)
            return out.copy_(result)
        return self._uncovered(func, name, args, kwargs, None)

    def _integers(self, func, types, args, kwargs):
        """An operation without floating-point operands: torch's result where it holds no
        floating-point values (integer arithmetic is exact), else (`exp` of an integer tensor,
        a true division of two) the operation again on its integer tensors promoted to that
        result's dtype, as torch promotes them, through this mode's kernels."""
        result = func(*args, **kwargs)
        if not operands.scan((result,), None) & operands.INEXACT_ANY:
            return result
        wide = operands.promoted(func, args, kwargs, result)
        if wide is None:  # from Python numbers, or integers added exactly (bincount's weights)
            return result
        return self.__torch_dispatch__(func, types, *wide)

    def _decomposed(self, func, decomposition, name, args, kwargs):
        """PyTorch's decomposition of `func`, each of its operations routed through this mode;
        one that decomposes into itself is uncovered."""
        running = getattr(_decomposing, "ops", None)
        if running is None:
            running = _decomposing.ops = set()
        if func in running:
            return self._uncovered(func, name, args, kwargs, "its decomposition calls itself")
        running.add(func)
        try:
            with self:
                out = decomposition(*args, **kwargs)
        finally:
            running.discard(func)
        if out is NotImplemented:  # the decomposition does not handle these arguments
            return self._uncovered(func, name, args, kwargs, "no decomposition for these arguments")
        return out

    def _foreach(self, func, name, args, kwargs):
        """A `_foreach_` operation as the per-tensor operation on each list element, each routed
        through this mode (so covered exactly when the per-tensor operation is). Positional
        arguments past the per-tensor operation's own become its keyword-only ones (`value` of
        addcmul_), a tensor of per-element scalars gives each element its own, and an in-place
        form with no in-place per-tensor operation (`maximum_`) writes the out-of-place result."""
        base = func.overloadpacket.__name__[len("_foreach_") :]
        inplace = base.endswith("_")
        single = getattr(torch.ops.aten, base, None)
        write_back = single is None and inplace
        if write_back:
            single = getattr(torch.ops.aten, base[:-1], None)
        if single is None:
            return self._uncovered(func, name, args, kwargs, None)
        overload = getattr(
            single, "default" if "default" in single.overloads() else single.overloads()[0]
        )
        positional = sum(1 for a in overload._schema.arguments if not a.kwarg_only)
        keyword = [a.name for a in overload._schema.arguments if a.kwarg_only]
        names = [a.name for a in func._schema.arguments]
        args = [
            a.tolist() if isinstance(a, torch.Tensor) and names[i] == "scalars" else a
            for i, a in enumerate(args)
        ]
        count = len(args[0])

        def pick(value, i):
            return value[i] if isinstance(value, (list, tuple)) else value

        results = []
        with self:
            for i in range(count):
                args_i = [pick(a, i) for a in args]
                kwargs_i = {k: pick(v, i) for k, v in kwargs.items()}
                kwargs_i.update(zip(keyword, args_i[positional:]))
                out = single(*args_i[:positional], **kwargs_i)
                if write_back:
                    args[0][i].copy_(out)
                results.append(out)
        return None if inplace else results

    def _uncovered(self, func, name, args, kwargs, why):
        """strict: an error at every call (a program that catches it and calls again gets it
        again, never torch's kernel); audit and warn: torch's result, the op listed for the
        manifest (warn: one warning per operation)."""
        op = name if "::" in name else f"{func.namespace}::{name}"
        entry = self.uncovered.get(op)
        first = entry is None
        if first or self.policy == "strict":
            module, line = callsite.running_module_and_line()
        if first:
            entry = {"op": op, "module": module, "line": line, "why": why, "count": 0}
            self.uncovered[op] = entry
        if self.policy == "strict":
            raise PortableError(
                f"{op} is not covered by portable mode"
                + (f" ({why})" if why else "")
                + (f", in {module}" if module else "")
                + (f", called at {line}" if line else ""),
                hint="run `twice audit --portable -- <command>` for every uncovered "
                "operation; `--determinism warn` runs them with torch's kernels (their "
                "bits may then depend on the machine) and lists them in the manifest",
            )
        if first and self.policy != "audit":
            warnings.warn(
                escape_controls(
                    f"twice: {op} is not covered by portable mode"
                    + (f" ({why})" if why else "")
                    + (f" (in {module})" if module else "")
                    + (f" at {line}" if line else "")
                    + "; its bits may depend on the machine"
                ),
                stacklevel=2,
            )
        entry["count"] += 1
        return func(*args, **kwargs)


_enabled: dict = {"mode": None, "enablers": 0}  # the mode `enable` made, threads that called it
_mine = threading.local()  # .mode: this thread's entry of it (its own instance)
_lock = threading.Lock()


def enable(policy: str = "strict") -> PortableMode:
    """Route every operation of this thread (and the autograd it starts), and of every thread
    started from now on, through portable kernels; returns the mode (its `uncovered` lists what
    it could not cover). A dispatch mode is a thread's own: a thread the program starts would
    otherwise run torch's kernels unseen, so each enters the mode as it starts."""
    with _lock:
        mode = _enabled["mode"]
        if mode is None:
            mode = _enabled["mode"] = PortableMode(policy)
            switches.compile_eagerly(mode)
            _enabled["bootstrap"] = threading.Thread._bootstrap_inner
            threading.Thread._bootstrap_inner = _started_under_the_mode
        mode.policy = policy
        if getattr(_mine, "mode", None) is not None:
            return mode
        _enabled["enablers"] += 1
        _mine.mode = mode if _enabled["enablers"] == 1 else _Sharing()
    _mine.mode.__enter__()  # one instance per thread: torch keeps a mode's state per instance
    return mode


class _Sharing(PortableMode):
    """The mode in another thread: the policy and lists of the mode `enable` made (whichever is
    enabled now), and torch's own operations while none is. In a thread started under the mode
    it holds none of the process-wide settings (the enabling threads' entries hold them)."""

    def __init__(self, started: bool = False) -> None:
        super().__init__()
        if started:  # entered below, as nested: no settings of its own to save or restore
            self._thread.depth, self._thread.flushing = 1, switches.stop_flushing()

    @property
    def live(self) -> bool:
        return _enabled["mode"] is not None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        owner = _enabled["mode"]
        if owner is None:
            return func(*args, **(kwargs or {}))
        self.policy, self.uncovered, self.counts = owner.policy, owner.uncovered, owner.counts
        return super().__torch_dispatch__(func, types, args, kwargs)


def _started_under_the_mode(thread: threading.Thread) -> None:
    """threading.Thread's start in a new thread while the mode is enabled: the mode first, and
    off the thread's stack when it ends (torch aborts a process whose thread ends inside one)."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    if _enabled["mode"] is None:
        return _enabled["bootstrap"](thread)
    _push_mode(_Sharing(started=True))
    try:
        _enabled["bootstrap"](thread)
    finally:
        _pop_mode()


def entered() -> bool:
    """Whether this thread called `enable` (and not yet `disable`)."""
    return getattr(_mine, "mode", None) is not None


def disable() -> None:
    """Leave the portable mode `enable` installed (twice.deterministic's undo) in this thread,
    if it called `enable`; the last such thread retires it, and threads started meanwhile run
    torch's operations from then on."""
    mine = getattr(_mine, "mode", None)
    if mine is None:
        return
    with _lock:
        _mine.mode = None
        _enabled["enablers"] -= 1
        if not _enabled["enablers"]:
            owner, _enabled["mode"] = _enabled["mode"], None
            threading.Thread._bootstrap_inner = _enabled["bootstrap"]
            owner.undo_compile()
    mine.__exit__(None, None, None)


def active() -> PortableMode | None:
    """The mode `enable` installed in this process, if any."""
    return _enabled["mode"]
