"""The batch of a loop without a DataLoader: the data passed into each step's outermost module
calls (nanoGPT's `get_batch`, slicing a tensor, a hand-made iterator).

A step that reads no DataLoader batch would otherwise record none, and a changed data file would
show first as a changed loss, blamed on the computation. So every outermost call of a module (a
module called while no other is running: `model(x, y)`, `criterion(out, y)`) has its data
tensors digested: those no autograd graph produced (no grad_fn, not requiring grad), so that a
model's output passed on to a loss module is not counted as data, and a forward pass that
differs is never reported as a batch that differs. At the end of the step the recorder takes them
as its batch when no DataLoader batch came.
"""

from __future__ import annotations

from typing import Any

from twice.core.digests import Digester

__all__ = ["ModuleInputs"]


class _Calls:
    """The digests of some outermost calls' data: those sealed (entered before the step's last
    backward ended) and those entered since."""

    def __init__(self) -> None:
        self.digest: Digester | None = None  # the sealed calls'
        self.pending: Digester | None = None  # the calls entered since

    def add(self, data: list) -> None:
        if self.pending is None:
            self.pending = Digester(strict=False)
        self.pending.update(data)

    def seal(self) -> None:
        if self.pending is None:
            return
        if self.digest is None:
            self.digest = self.pending
        else:
            self.digest.update(self.pending.hexdigest())
        self.pending = None

    def take(self, sealed: bool) -> Digester | None:
        if not sealed:
            self.seal()
        digest, self.digest = self.digest, None
        return digest


class ModuleInputs:
    """Digests of the data tensors of the outermost module calls since the last step: those
    sealed (entered before the step's last backward ended, `seal`) and those entered since; the
    calls made with gradients off (an evaluation between steps) apart from the others."""

    def __init__(self) -> None:
        self.depth = 0  # module calls running now, nested
        self.trained = _Calls()  # the calls made with gradients on
        self.quiet = _Calls()  # the calls made without

    def enter(self, args: tuple, kwargs: dict, tensor_type: type, quiet: bool = False) -> None:
        """A module call starts; when it is the outermost, digest its data tensors."""
        self.depth += 1
        if self.depth != 1:
            return
        data = [v for v in (*args, *kwargs.values()) if _is_data(v, tensor_type)]
        if data:
            (self.quiet if quiet else self.trained).add(data)

    def leave(self) -> None:
        """A module call ended (returned or raised)."""
        self.depth = max(0, self.depth - 1)

    def seal(self) -> None:
        """A backward ended: the calls so far are this step's. In a loop that updates by hand the
        step ends only at the next step's first forward, whose inputs are digested by then."""
        self.trained.seal()
        self.quiet.seal()

    def take(self, sealed: bool = False) -> tuple[Digester | None, Digester | None]:
        """The digests of the data since the last take (only the sealed calls' when `sealed`):
        the calls' with gradients on, and those without (None where none); starts afresh."""
        return self.trained.take(sealed), self.quiet.take(sealed)


def _is_data(value: Any, tensor_type: type) -> bool:
    """A tensor the step was given, not one it computed: no grad_fn, not requiring grad (one
    level deep into tuples and lists, where batches are usually packed)."""
    if isinstance(value, tensor_type):  # a meta tensor holds no data to digest
        return value.grad_fn is None and not value.requires_grad and not value.is_meta
    if type(value) in (tuple, list) and len(value) <= 64:
        return bool(value) and all(_is_data(item, tensor_type) for item in value)
    return False
