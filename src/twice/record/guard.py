"""The capture guard: a recorder's event handler never crashes the training it watches.

An error of twice's own in a handler (a tensor it cannot read, a bug) stops the capture, with a
warning and `capture_error.json` in the run folder naming the step and the error; the training
goes on, and the trace holds the steps before it. The time spent in handlers is the recorder's
`cost` (what tracing costs the run).
"""

from __future__ import annotations

import functools
import time
import traceback
import warnings

from twice.core.escaping import escape_controls
from twice.record.replicas import ReplicaDesync
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder

__all__ = ["costed", "guarded", "stop_capture"]


def costed(method):
    """Adds the time spent in an event handler to the recorder's `cost` (what tracing costs the
    run)."""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.cost += time.perf_counter() - start

    return timed


def guarded(method):
    """A zero-code event handler that never crashes the training it watches: an error of its own
    (a tensor it cannot read, a bug) stops the capture, with a warning and `capture_error.json` in
    the run folder naming the step and the error, and the training goes on; the trace holds the
    steps before it. What twice raises on purpose (a stop after --max-steps, a replica desync)
    passes.
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
                stop_capture(self, name, exc)
                return None
        finally:
            self.cost += clock() - start

    return guarded


def stop_capture(recorder, handler: str, exc: Exception) -> None:
    """Stop `recorder`'s capture after an error of its own in `handler`: record it and warn."""
    recorder.capture_error = {
        "step": recorder.step_index,
        "handler": handler,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
    }
    recorder.drop_open_step()  # the step cut short is not written
    path = RunFolder(recorder.run_dir).capture_error
    try:
        recorder.close_trace()
        recorder.run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, recorder.capture_error)
    except OSError:
        pass
    # Placed at "twice" rather than at a line of the hook machinery, which would say nothing useful.
    warnings.warn_explicit(
        escape_controls(
            f"twice: step capture stopped at step {recorder.step_index}: "
            f"{type(exc).__name__}: {exc}; "
            f"the training goes on untraced (the trace holds steps 0-{recorder.step_index - 1}; "
            f"details in {path})"
        ),
        RuntimeWarning,
        "twice",
        0,
        module="twice",
    )
