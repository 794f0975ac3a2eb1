"""Numerical health: where a NaN or Inf really comes from, and the saturation that led to it.

`watch()` (and `twice run --numerics`) checks every operation's floating outputs in forward,
backward, user code between backward and the optimizer step, and the optimizer update. At the
first non-finite value it reports the step, phase, operation, module, the user's line and what
was wrong with each input (zero, tiny, huge, infinite, NaN), preceded by the early warnings that
led there (saturated softmax/sigmoid/tanh, exactly-zero gradients, division by zero, exp
overflow), first cause first, each with a suggested fix. The cheap mode (always on under
`twice run`) checks only the loss, gradients and parameters once per step.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from twice.core.errors import Exit
from twice.record.callsite import division_operands
from twice.record.health import Event, HealthLog
from twice.record.numlinks import name_operands, zero_gradients
from twice.record.opargs import op_tensors as _tensors
from twice.record.opcontrol import numerics_watch, set_numerics_watch
from twice.record.oplog import OpContext
from twice.store.layout import RunFolder

__all__ = ["watch", "NumericsWatch", "NonFiniteError", "active_watch"]
SATURATION_SHARE = 0.5  # warn when at least this share of an activation's outputs is saturated
MAX_EVENTS = 2000


class NonFiniteError(FloatingPointError):
    """Raised by `watch(mode="stop")` at the first NaN or Inf; `report` holds the whole story."""

    def __init__(self, report: dict):
        self.report = report
        fault = report["fault"]
        where = (
            f"{fault['op']} "
            f"({fault['phase']}{', ' + fault['module'] if fault.get('module') else ''})"
        )
        super().__init__(
            f"{fault['value']} first produced by {where} at "
            f"{fault.get('line') or 'an unknown line'}, "
            f"step {fault['step']}; causes: "
            f"{'; '.join(e['summary'] for e in report['chain'][:-1]) or 'none recorded'}"
        )


def describe(tensor: torch.Tensor) -> dict:
    """What is wrong with a tensor, numerically: zeros, tiny (subnormal), huge, infinite, NaN."""
    if not tensor.dtype.is_floating_point or tensor.numel() == 0:
        return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}
    t = tensor.detach()
    finite = t[t.isfinite()]
    tiny = torch.finfo(t.dtype).tiny
    magnitude = finite.abs()
    zeros = int((t == 0).sum())
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "zeros": zeros,
        "all_zero": zeros == t.numel(),
        "tiny": int(((magnitude > 0) & (magnitude < tiny)).sum()),
        "huge": int((magnitude > 1e30).sum()),
        "inf": int(t.isinf().sum()),
        "nan": int(t.isnan().sum()),
        "min": float(finite.min()) if finite.numel() else None,
        "max": float(finite.max()) if finite.numel() else None,
    }


def _flags(info: dict) -> list[str]:
    words = []
    if info.get("all_zero"):
        words.append("all zero")
    elif info.get("zeros"):
        words.append(f"{info['zeros']} exact zeros")
    for key in ("tiny", "huge", "inf", "nan"):
        if info.get(key):
            words.append(f"{info[key]} {key}")
    return words


_ALLOCATING = {
    "aten::empty",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::resize_",
    "aten::empty_permuted",
}
_SATURATING = {
    "aten::_softmax": (0.0, 1.0),
    "aten::softmax": (0.0, 1.0),
    "aten::sigmoid": (0.0, 1.0),
    "aten::tanh": (-1.0, 1.0),
}


class NumericsWatch(OpContext):
    """Checks every op's outputs; see the module docstring. mode: "stop" raises, "warn" records
    and goes on."""

    def __init__(
        self,
        mode: str = "stop",
        run_dir: Path | None = None,
        step_source=None,
        exit_on_fault: bool = False,
    ):
        super().__init__(step=0, forward_lines=False)
        if mode not in ("stop", "warn"):
            raise ValueError(f"mode must be 'stop' or 'warn', not {mode!r}")
        self.mode = mode
        # Under `twice run --numerics stop`: end the process with one line, not a traceback
        # through the dispatch machinery (library use gets the NonFiniteError to catch).
        self.exit_on_fault = exit_on_fault
        self.log = HealthLog(run_dir)
        self.report: dict | None = None
        self._step_source = step_source

    @property
    def current_step(self) -> int:
        """The step being checked (the recorder's, where one runs)."""
        return self._step_source() if self._step_source is not None else self.step

    def on_op(self, func, args, kwargs):
        """Check one operation's floating outputs; note saturation, zero gradients, overflows."""
        name = str(func.name())
        base = name.split(".")[0]
        before = None
        # Not in the optimizer phase: its in-place updates of parameters and moments are many and
        # large, and a fault there is explained by its scalars (learning rate) and gradients.
        if (
            self.phase != "optimizer"
            and base.endswith("_")
            and not base.startswith("aten::_foreach")
            and args
            and isinstance(args[0], torch.Tensor)
            and args[0].dtype.is_floating_point
        ):
            # An in-place op overwrites its first input: keep a copy to say what it was if this op
            # goes bad.
            before = args[0].detach().clone()
        out = func(*args, **kwargs)
        if name.split(".")[0] in _ALLOCATING:
            return out  # uninitialised memory (NaN-filled in deterministic mode), not a computation
        outputs = [t for t in _tensors(out) if t.dtype.is_floating_point and t.numel()]
        if not outputs:
            return out
        if base in _SATURATING or base == "aten::_log_softmax":
            self._check_saturation(base, outputs[0])
        if base in ("aten::div", "aten::div_"):
            self._check_division(name, args, before)
        # One sum per output: finite values sum to a finite number unless they overflow, which the
        # exact check then rules out. Much cheaper than materialising isfinite() for every op.
        bad = next(
            (
                t
                for t in outputs
                if not math.isfinite(float(t.sum())) and not bool(t.isfinite().all())
            ),
            None,
        )
        if bad is not None and self.report is None:
            self._fault(name, args, kwargs, bad, before)
        return out

    def _event(self, kind: str, summary: str, op: str, **details) -> Event:
        where = self.where()
        if "node" in where:
            details["node"] = where.pop("node")
        return Event(kind, self.current_step, summary, op, **where, details=details)

    def _check_saturation(self, base: str, out: torch.Tensor) -> None:
        if base == "aten::_log_softmax":
            # Probability exactly 1 for the top class: its log-probability is exactly 0.
            rows = out.reshape(-1, out.shape[-1]) if out.dim() else out.reshape(1, 1)
            share = float((rows.max(dim=-1).values == 0).float().mean())
            label = "softmax (in log_softmax / cross_entropy)"
        else:
            low, high = _SATURATING[base]
            share = float(((out == low) | (out == high)).float().mean())
            label = base.removeprefix("aten::").strip("_")
        if share >= SATURATION_SHARE:
            what = (
                "of rows have a probability of exactly 1"
                if base == "aten::_log_softmax"
                else "of outputs exactly at their limits"
            )
            event = self._event(
                "saturation", f"{label} saturated: {share:.0%} {what}", base, share=share
            )
            self.log.add(event)

    def _check_division(self, name: str, args, before: torch.Tensor | None) -> None:
        if len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].dtype.is_floating_point:
            divisor = args[1].detach()
            zeros = int((divisor.abs() < torch.finfo(divisor.dtype).tiny).sum())
            if zeros:
                event = self._event(
                    "div_by_zero",
                    f"division by "
                    f"{'an exact or subnormal zero' if zeros == 1 else f'{zeros} zeros'}",
                    name,
                    zeros=zeros,
                )
                name_operands(event, before if before is not None else args[0])
                self.log.add(event)

    def _fault(
        self, name: str, args, kwargs, bad: torch.Tensor, before: torch.Tensor | None
    ) -> None:
        value = "NaN" if bool(bad.isnan().any()) else "Inf"
        inputs = []
        for index, tensor in enumerate(_tensors((args, kwargs))):
            info = describe(before if index == 0 and before is not None else tensor)
            inputs.append({"index": index, **info, "flags": _flags(info)})
        scalars = {
            f"arg{i}": a
            for i, a in enumerate(args)
            if isinstance(a, float) and not math.isfinite(a)
        }
        scalars.update(
            {k: v for k, v in kwargs.items() if isinstance(v, float) and not math.isfinite(v)}
        )
        where = self.where()
        base = name.split(".")[0]
        if scalars:
            self.log.add(
                self._event(
                    "bad_scalar",
                    f"scalar argument {', '.join(f'{k}={v}' for k, v in scalars.items())} of "
                    f"{name}",
                    name,
                    scalars={k: str(v) for k, v in scalars.items()},
                )
            )
        if base in ("aten::log", "aten::log_") and any(i.get("zeros") for i in inputs):
            self.log.add(self._event("log_of_zero", f"log of exact zero in {name}", name))
        if base == "aten::exp" and all(not i.get("inf") for i in inputs):
            self.log.add(
                self._event(
                    "exp_overflow",
                    f"exp overflowed to inf (input max {inputs[0].get('max')})",
                    name,
                )
            )
        event = zero_gradients(self.current_step, args[0] if before is not None else None, before)
        if event is not None:
            self.log.add(event)
        operands = division_operands(where.get("line")) if base.startswith("aten::div") else None
        culprit = (
            "; ".join(
                f"input {i['index']}"
                + (f" (`{operands[i['index']]}`)" if operands and i["index"] < 2 else "")
                + f": {', '.join(i['flags'])}"
                for i in inputs
                if i["flags"]
            )
            or "inputs all finite and non-zero"
        )
        fault = Event(
            "non_finite",
            self.current_step,
            f"first {value} produced by {name} ({culprit})",
            name,
            where["phase"],
            where.get("module"),
            where.get("line"),
            details={
                "value": value,
                "inputs": inputs,
                "scalars": {k: str(v) for k, v in scalars.items()},
                "node": where.get("node"),
            },
        )
        self.report = {
            "fault": {
                "value": value,
                "op": name,
                "step": self.current_step,
                **where,
                "inputs": inputs,
            },
            "chain": self.log.chain(fault),
        }
        if self.log.run_dir is not None:
            from twice.store.files import write_json_atomic

            write_json_atomic(RunFolder(self.log.run_dir).numerics_report, self.report)
        if self.mode == "stop":
            if self.exit_on_fault:
                self.stop_process(fault)
            raise NonFiniteError(self.report)

    def stop_process(self, fault: Event) -> None:
        """End the process at the fault: one line on stderr (escaped: it names the user's
        tensors), exit status 4 (Exit.NUMERICS), no traceback."""
        import sys

        from twice.core.escaping import escape_controls

        where = f" at {fault.line}" if fault.line else ""
        run = f" {self.log.run_dir}" if self.log.run_dir is not None else ""
        sys.stderr.write(
            escape_controls(
                f"twice: stopped at step {fault.step}: {fault.summary}{where}; "
                f"`twice nan{run}` tells the story\n"
            )
        )
        sys.stderr.flush()
        raise SystemExit(Exit.NUMERICS)


def active_watch() -> NumericsWatch | None:
    """The numerics watch in force in this process, or None (held by record/opcontrol.py, whose
    modes watch each step: this module, above the recorder, tells it)."""
    return numerics_watch()


class watch:
    """Check every operation for NaN/Inf from here on (a context manager; or call `.start()`).

    >>> with twice.numerics.watch(mode="stop"):        # doctest: +SKIP
    ...     train()
    """

    def __init__(
        self, mode: str = "stop", run_dir: str | Path | None = None, exit_on_fault: bool = False
    ):
        from twice.record.hooks import active_recorder

        recorder = active_recorder()
        run_dir = run_dir or (recorder.run_dir if recorder is not None else None)
        self.mode = NumericsWatch(
            mode,
            run_dir,
            step_source=(lambda: recorder.step_index) if recorder else None,
            exit_on_fault=exit_on_fault,
        )
        self._recorder = recorder

    def start(self) -> NumericsWatch:
        """Start checking every operation (until stop())."""
        self.mode.__enter__()
        set_numerics_watch(self.mode)
        return self.mode

    def stop(self) -> None:
        """Stop checking operations and close the watch's log."""
        if numerics_watch() is self.mode:
            self.mode.__exit__(None, None, None)
            self.mode.close()
            set_numerics_watch(None)

    def __enter__(self) -> NumericsWatch:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
