"""The steps of an optimizer loop: each optimizer's `step()` adds its gradients, parameters and
learning rates to the open round, with what the step consumed; where the round ends
(core/steps.py's RoundClock), it is written and the next step numbered.

`OptimizerRounds` is a part of `Recorder` (record/recorder.py), which gives it the optimizer step
events of the loop's outermost optimizers: it is given the lifecycle (the numbering), the open
step (the round and what was consumed), the step data (digests and the trace) and the op control
(the phase of the step; twice's own work kept out of the watching modes).
"""

from __future__ import annotations

from twice.core.digests import digest, digest_pairs, float_bits
from twice.record.lifecycle import Lifecycle
from twice.record.opcontrol import OpControl
from twice.record.openstep import OpenStep
from twice.record.stepdata import StepData
from twice.rng.fingerprint import rng_digests

__all__ = ["OptimizerRounds"]


class OptimizerRounds:
    """Fills the open round from optimizer steps and ends it."""

    def __init__(self, life: Lifecycle, open_step: OpenStep, data: StepData, ops: OpControl):
        self._life, self._open, self._data, self._ops = life, open_step, data, ops

    def before_step(self, optimizer, args, kwargs) -> None:
        """`optimizer.step()` is about to run: the round may end first; its gradients, as the
        update will use them."""
        open_step = self._open
        if open_step.clock.closes(id(optimizer)):
            self.finish_round()
        if open_step.probe_params and not open_step.clock.members:
            # The first step after a resume: record the parameters as loaded, to tell a model that
            # was not restored from an optimizer or RNG that was not.
            open_step.probe_params = False
            with self._ops.paused():
                open_step.round.params_before = digest_pairs(
                    [(n, digest(p)) for n, p in self._data.names.of(optimizer)]
                )
        # A torch.optim step's ops all come from the line calling step(); a user's own optimizer's
        # have lines of their own.
        self._ops.set_phase(
            "optimizer", step_line_shared=type(optimizer).__module__.startswith("torch.")
        )
        if self._life.tracing_now() and not _has_closure(args, kwargs):
            # Before the update: some optimizers (maximize=True) change the gradients in place.
            with self._ops.paused():
                self._data.take_grads(open_step.round, optimizer)

    def after_step(self, optimizer, args, kwargs, skipped: bool) -> None:
        """`optimizer.step()` has run (or GradScaler skipped it: `skipped`): its parameters and
        learning rates; the round may end here."""
        open_step = self._open
        round_ = open_step.round
        complete = open_step.clock.add(id(optimizer))
        round_.skipped = round_.skipped or skipped
        if open_step.clock.size is None:
            # The first round's end is only known when an optimizer repeats; with one optimizer
            # (the usual case) it ends here, so start recording the next step now if chosen.
            self._ops.start(self._life.step_index + 1)
        with self._ops.paused():
            self._record(optimizer, args, kwargs, round_, complete)

    def _record(self, optimizer, args, kwargs, round_, complete: bool) -> None:
        life, open_step = self._life, self._open
        if life.tracing_now():
            data = self._data
            if _has_closure(args, kwargs):
                # a closure (LBFGS) computes the gradients inside step()
                data.take_grads(round_, optimizer)
            data.take_params(round_, optimizer, life.step_index)
            round_.lr.extend(
                float_bits(float(group["lr"])) for group in optimizer.param_groups if "lr" in group
            )
            open_step.move_pending(round_)
            round_.rng = rng_digests()
        else:  # what this untraced step consumed: not the next traced step's
            open_step.drop_pending()
            open_step.inputs.take()
        if complete:
            self.finish_round()

    def finish_round(self) -> None:
        """The open round ended: write it (if traced) and number the next step."""
        open_step = self._open
        if not open_step.clock.members:
            return
        life = self._life
        if life.tracing_now():
            self._data.write(open_step.round, life.step_index, replicas=True)
        open_step.end_round()
        life.advance()


def _has_closure(args, kwargs) -> bool:
    # Step hooks receive the bound call's arguments: args[0] is the optimizer itself.
    return (len(args) > 1 and callable(args[1])) or (
        bool(kwargs) and callable(kwargs.get("closure"))
    )
