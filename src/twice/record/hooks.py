"""The patched torch entry points that feed the recorder: optimizer steps (step hooks), backward,
batches (the DataLoader iterator), module calls (nn.Module.__call__), torch.compile and
GradScaler.step.

`install(recorder)` routes this process's events to one Recorder; `uninstall()` restores torch.
Forked children get a recorder stream of their own (see Recorder.after_fork_in_child).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from twice.record import recorder as _recorder_module
from twice.record.recorder import Recorder

__all__ = ["install", "uninstall", "active_recorder"]

_recorder: Recorder | None = None
# torch.is_grad_enabled once install ran: whether a module call trains or evaluates
_grad_enabled: list = [lambda: True]
_handles: list[Any] = []
_scaler_depth = [0]  # GradScaler.step calls in progress (see install)
_originals: dict[str, Any] = {}


def active_recorder() -> Recorder | None:
    """The recorder this process's hooks feed, or None outside a recorded run."""
    return _recorder


def _before_fork() -> None:
    if _recorder is not None:
        _recorder.fork_count += 1


def _after_fork_child() -> None:
    if _recorder is not None:
        _recorder.after_fork_in_child(_recorder.fork_count)


# torch's own code that gives an optimizer its state by one step with zero gradients and a zero
# learning rate (Distributed Checkpoint's state-dict API, NamedOptimizer): not a training step.
_STATE_INIT = {"_init_optim_state": "state_dict.py", "init_state": "named_optimizer.py"}
_initialising: list[int] = []  # the optimizers whose state-initialising step is running


def _initialising_state() -> bool:
    """Whether the optimizer step now starting is one of torch's state initialisations (a caller
    a few frames up, between the hook and the code that called step())."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        code = frame.f_code
        where = _STATE_INIT.get(code.co_name)
        if where is not None and code.co_filename.endswith(where) and "torch" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def _pre_step(optimizer, args, kwargs) -> None:
    recorder = _recorder
    if recorder is None:
        return
    # Only an optimizer without state can be given its state (the frames are walked only then:
    # after its first step a stateful optimizer costs one test here)
    if not getattr(optimizer, "state", True) and _initialising_state():
        _initialising.append(id(optimizer))
        return
    recorder.pre_step(optimizer, args, kwargs)


def _post_step(optimizer, args, kwargs) -> None:
    recorder = _recorder
    if recorder is None:
        return
    if _initialising and _initialising[-1] == id(optimizer):  # the end of that step
        _initialising.pop()
        return
    recorder.post_step(optimizer, args, kwargs)


def _backward_starts(tensors) -> Recorder | None:
    recorder = _recorder
    if recorder is not None:
        recorder.on_backward(tensors)
        recorder.set_phase("backward")
    return recorder


def _backward_ends(recorder: Recorder) -> None:
    recorder.set_phase("user")  # between backward and the optimizer: gradient edits, clipping
    if recorder._hand is not None:  # no optimizer has stepped: the loop may update by hand
        recorder.after_backward()


def _batch_read(batch) -> None:
    recorder = _recorder
    if recorder is not None:
        recorder.on_batch(batch)


def _module_enters(module, args: tuple, kwargs: dict) -> None:
    recorder = _recorder
    if recorder is not None:
        recorder.on_module_call(module, args, kwargs, _grad_enabled[0]())


def _recorder_leaves() -> None:
    recorder = _recorder
    if recorder is not None:
        recorder.inputs.leave()


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
    module_enters = staticmethod(_module_enters)
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
    for name in (
        "pre_step",
        "post_step",
        "backward_starts",
        "backward_ends",
        "batch_read",
        "step_skipped",
        "module_enters",
    ):
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
    """Route optimizer steps, backward calls and DataLoader batches of this process to
    `recorder`."""
    global _recorder
    import torch
    from torch.utils.data import dataloader

    if _recorder is not None:
        uninstall()
    _recorder = recorder
    _recorder_module.tensor_type[0] = torch.Tensor
    _grad_enabled[0] = torch.is_grad_enabled
    if _compiling_already():
        _compile_safe()
    _register_step_hooks()

    original_backward = torch.autograd.backward
    original_next = dataloader._BaseDataLoaderIter.__next__
    original_compile = torch.compile
    original_call = torch.nn.Module.__call__
    _originals.update(
        backward=original_backward, next=original_next, compile=original_compile, call=original_call
    )
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

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

    def module_call(self, *args, **kwargs):
        # Every module call, to find each step's outermost ones (record/inputs.py). Compiled code
        # is left alone: Dynamo folds is_compiling() to True and traces the plain call.
        recorder = _recorder
        if recorder is None or is_compiling():
            return original_call(self, *args, **kwargs)
        if recorder.inputs.depth:  # an inner call (most of them): counted, nothing more
            recorder.inputs.depth += 1
        else:
            _Calls.module_enters(self, args, kwargs)
        try:
            return original_call(self, *args, **kwargs)
        finally:
            _recorder_leaves()

    @functools.wraps(original_compile)
    def compile(*args, **kwargs):
        _compile_safe()
        return original_compile(*args, **kwargs)

    torch.autograd.backward = backward
    dataloader._BaseDataLoaderIter.__next__ = next_batch
    torch.nn.Module.__call__ = module_call
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
    recorder.ops.start(recorder.step_index)
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
        torch.nn.Module.__call__ = _originals.pop("call")
        dataloader._BaseDataLoaderIter.__next__ = _originals.pop("next")
        torch.compile = _originals.pop("compile")
    if "scaler_step" in _originals:
        scaler_class, original = _originals.pop("scaler_step")
        scaler_class.step = original
