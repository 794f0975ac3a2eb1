"""The hand-loop watch: where a step ends in a loop that updates its tensors without torch.optim.

After a backward call the watch digests the gradients the update will read and arms a forward
hook; the step ends at the next forward (or backward, or batch) once the tensors were updated
(record/handsteps.py counts the updates). `HandLoopWatch` is a part of `Recorder`
(record/recorder.py): it uses the recorder's HandSteps (`_hand`) and its step data.
"""

from __future__ import annotations

from twice.core.digests import digest_pairs
from twice.record.guard import guarded
from twice.record.handsteps import HandSteps
from twice.record.openstep import StepRound
from twice.record.stepdata import name_of, tensor_of
from twice.rng.fingerprint import rng_digests

__all__ = ["HandLoopWatch"]


class HandLoopWatch:
    """The recorder's part that finds the steps of a loop that updates by hand."""

    _hand: HandSteps | None

    @guarded
    def after_backward(self) -> None:
        """A backward call ended in a loop that has no optimizer (yet): its gradients, as the
        update will read them, and the counters that show the update."""
        hand = self._hand
        if hand is None or self.explicit or self._stepping is not None or hand.leaves is None:
            return
        if not hand.confirmed:
            # Not yet known to be a hand loop (most first backward calls come before an
            # optimizer's step): what the watch cannot read ends the watch, not the capture.
            try:
                self._watch_backward(hand)
            except Exception:  # noqa: BLE001 - the optimizer hooks may still record this loop
                hand.unwatch()
                self._hand = None
            return
        self._watch_backward(hand)

    def _watch_backward(self, hand: HandSteps) -> None:
        with self._paused():
            names, grads = self._named_grads(hand.leaves)
            digests, hand.grad_squares = self._digests(grads, True)
            hand.grad_digests = list(zip(names, digests))
        if self.probe_params and hand.params_before is None:  # before the first update
            leaves = self.names.of(hand.leaves)
            with self._paused():
                digests, _ = self._digests(list(map(tensor_of, leaves)), False)
            hand.params_before = digest_pairs(list(zip(map(name_of, leaves), digests)))
        hand.backward_ended(len(self._pending_losses), len(self._pending_batches))
        hand.watch_forward(self._hand_forward)

    @guarded
    def _hand_forward(self) -> None:
        """The first module forward after a backward: the step ends here if it was updated."""
        hand = self._hand
        if hand is not None:
            hand.unwatch()
            if hand.open:
                self._hand_check(False)

    def _hand_check(self, before_backward: bool) -> None:
        """End the open hand step if its tensors were updated; before the next backward, whose
        accumulation would hide it, also if its gradients' bytes changed (an update and a
        zeroing through `.data` move no counter)."""
        hand = self._hand
        if not hand.updated():
            if not before_backward:
                return
            with self._paused():
                names, grads = self._named_grads(hand.leaves)
                now, _ = self._digests(grads, False)
            if list(zip(names, now)) == hand.grad_digests:
                return  # gradient accumulation: the same step goes on
        self._end_hand_step()
        self._exit_if_stopping()

    def _end_hand_step(self) -> None:
        hand = self._hand
        if self._tracing_this_step():
            round_ = self._round = StepRound()
            round_.params_before, hand.params_before = hand.params_before, None
            self.probe_params = False
            round_.grads.extend(hand.grad_digests)
            round_.grad_squares.extend(hand.grad_squares)
            with self._paused():
                self._take_params(hand.leaves)
                self._move_pending(round_, hand.losses, hand.batches)
                round_.rng = rng_digests()
            self._write_round(replicas=True)
        else:
            del self._pending_losses[: hand.losses], self._pending_batches[: hand.batches]
        hand.close()
        hand.confirmed = True
        self._round = StepRound()
        self._advance()
