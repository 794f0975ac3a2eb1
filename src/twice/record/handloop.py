"""The hand-loop watch: where a step ends in a loop that updates its tensors without torch.optim.

After a backward call the watch digests the gradients the update will read and arms a forward
hook; the step ends at the next forward (or backward, or batch) once the tensors were updated
(record/handsteps.py counts the updates). `HandLoopWatch` is a part of `Recorder`
(record/recorder.py) until an optimizer steps: it owns the open hand step (HandSteps) and is given
the lifecycle (the numbering), the open step (what the step consumed), the step data (digests and
the trace), the op control's `paused` and the recorder's guarded forward handler.
"""

from __future__ import annotations

from collections.abc import Callable

from twice.core.digests import digest_pairs
from twice.record.handsteps import HandSteps
from twice.record.lifecycle import Lifecycle
from twice.record.openstep import OpenStep, StepRound
from twice.record.stepdata import StepData, name_of, tensor_of
from twice.rng.fingerprint import rng_digests

__all__ = ["HandLoopWatch"]


class HandLoopWatch:
    """Finds the steps of a loop that updates by hand, and ends them."""

    def __init__(
        self,
        life: Lifecycle,
        open_step: OpenStep,
        data: StepData,
        paused: Callable,
        on_forward: Callable[[], None],
    ):
        """A watch whose forward hook calls `on_forward` (which calls `forward_seen`)."""
        self.steps = HandSteps()
        self._life, self._open, self._data = life, open_step, data
        self._paused, self._on_forward = paused, on_forward

    def before_backward(self, tensors) -> None:
        """A backward call begins: the open step ends first if it was updated; a new step's first
        backward walks its graph for the leaves."""
        if self.steps.open:
            self.check(True)
        self.steps.backward_starts(tensors)

    def after_backward(self) -> bool:
        """A backward call ended: its gradients, as the update will read them, and the counters
        that show the update. False: the watch could not read a loop not yet known to update by
        hand, and has ended (the optimizer hooks may still record it)."""
        hand = self.steps
        if hand.leaves is None:
            return True
        if not hand.confirmed:
            # Not yet known to be a hand loop (most first backward calls come before an
            # optimizer's step): what the watch cannot read ends the watch, not the capture.
            try:
                self._watch_backward()
            except Exception:  # noqa: BLE001 - the optimizer hooks may still record this loop
                hand.unwatch()
                return False
            return True
        self._watch_backward()
        return True

    def _watch_backward(self) -> None:
        hand, data = self.steps, self._data
        with self._paused():
            names, grads = data.named_grads(hand.leaves)
            digests, hand.grad_squares = data.digests(grads, True)
            hand.grad_digests = list(zip(names, digests))
        if self._open.probe_params and hand.params_before is None:  # before the first update
            leaves = data.names.of(hand.leaves)
            with self._paused():
                digests, _ = data.digests(list(map(tensor_of, leaves)), False)
            hand.params_before = digest_pairs(list(zip(map(name_of, leaves), digests)))
        hand.backward_ended(len(self._open.losses), len(self._open.batches))
        self._open.inputs.seal()  # the inputs so far are this step's, not the next forward's
        hand.watch_forward(self._on_forward)

    def forward_seen(self) -> None:
        """The first module forward after a backward: the step ends here if it was updated."""
        hand = self.steps
        hand.unwatch()
        if hand.open:
            self.check(False)

    def check(self, before_backward: bool) -> None:
        """End the open hand step if its tensors were updated; before the next backward, whose
        accumulation would hide it, also if its gradients' bytes changed (an update and a
        zeroing through `.data` move no counter)."""
        hand = self.steps
        if not hand.updated():
            if not before_backward:
                return
            with self._paused():
                names, grads = self._data.named_grads(hand.leaves)
                now, _ = self._data.digests(grads, False)
            if list(zip(names, now)) == hand.grad_digests:
                return  # gradient accumulation: the same step goes on
        self.end_step()
        self._life.exit_if_stopping()

    def end_step(self) -> None:
        """The open hand step ended: write its round (if traced) and number the next step."""
        hand, life, open_step, data = self.steps, self._life, self._open, self._data
        if life.tracing_now():
            round_ = open_step.round = StepRound()
            round_.params_before, hand.params_before = hand.params_before, None
            open_step.probe_params = False
            round_.grads.extend(hand.grad_digests)
            round_.grad_squares.extend(hand.grad_squares)
            with self._paused():
                data.take_params(round_, hand.leaves, life.step_index)
                open_step.move_pending(round_, hand.losses, hand.batches, sealed=True)
                round_.rng = rng_digests()
            data.write(round_, life.step_index, replicas=True)
        else:
            open_step.drop_pending(hand.losses, hand.batches)
            open_step.inputs.take(sealed=True)  # an untraced step's: not the next traced one's
        hand.close()
        hand.confirmed = True
        open_step.round = StepRound()
        life.advance()

    def drop_step(self) -> None:
        """Forget the open hand step (a resume, a capture stopped): the next backward starts one."""
        self.steps.close()

    def stop(self) -> None:
        """The loop is not a hand loop (an optimizer stepped, or the script marks its steps)."""
        self.steps.unwatch()

    def forked(self) -> None:
        """In a forked child: a fresh watch (the forward hook is the parent's)."""
        self.steps.unwatch()
        self.steps = HandSteps()
