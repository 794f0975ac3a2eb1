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


class ModuleInputs:
    """Digests of the data tensors of the outermost module calls since the last step."""

    def __init__(self) -> None:
        self.depth = 0  # module calls running now, nested
        self.digest: Digester | None = None

    def enter(self, args: tuple, kwargs: dict, tensor_type: type) -> None:
        """A module call starts; when it is the outermost, digest its data tensors."""
        self.depth += 1
        if self.depth != 1:
            return
        data = [v for v in (*args, *kwargs.values()) if _is_data(v, tensor_type)]
        if not data:
            return
        if self.digest is None:
            self.digest = Digester(strict=False)
        self.digest.update(data)

    def leave(self) -> None:
        """A module call ended (returned or raised)."""
        self.depth = max(0, self.depth - 1)

    def take(self) -> Digester | None:
        """The digest of the data since the last take, or None; starts afresh."""
        digest, self.digest = self.digest, None
        return digest


def _is_data(value: Any, tensor_type: type) -> bool:
    """A tensor the step was given, not one it computed: no grad_fn, not requiring grad (one
    level deep into tuples and lists, where batches are usually packed)."""
    if isinstance(value, tensor_type):  # a meta tensor holds no data to digest
        return value.grad_fn is None and not value.requires_grad and not value.is_meta
    if type(value) in (tuple, list) and len(value) <= 64:
        return bool(value) and all(_is_data(item, tensor_type) for item in value)
    return False
