"""Steps of loops that update parameters by hand (no torch.optim): where one ends.

A tutorial loop calls `loss.backward()` and then `p -= lr * p.grad` under `no_grad` (or
`p.data.add_(p.grad, alpha=-lr)`), and zeroes the gradients. No optimizer hook fires, so the
recorder watches the tensors the backward pass produced gradients for (the leaves of its graph)
instead. A step ends once they have been updated, seen at the next event that can only come after
an update: a module's forward, a DataLoader batch, the next backward call, the end of the process.

"Updated" is read from counters PyTorch keeps anyway, no tensor is read: a leaf's version (bumped
by in-place updates such as `p -= ...`, `p.add_(...)`, `p.copy_(...)`), and its gradient's
identity and version (replaced or set to None by `zero_grad()`, bumped by `p.grad.zero_()` or
clipping). An update through `.data` bumps neither; such loops zero the gradients through `.data`
too, so before the next backward (the last moment: it would add to them) the gradients' digests
are compared with those the backward left. A backward whose leaves were not touched before the
next one is gradient accumulation: one step, however many backward calls.

Once an optimizer steps, the process is an optimizer loop and this watch ends for good.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HandSteps", "graph_leaves"]


def graph_leaves(tensors: Any) -> list:
    """The leaf tensors that a backward from `tensors` accumulates gradients into, in the order a
    depth-first walk of the graph meets them (the same for the same program)."""
    roots = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    stack = [getattr(t, "grad_fn", None) for t in reversed(roots)]
    seen: set[int] = set()
    held: list = []  # keeps the walked nodes alive, so that no id is reused during the walk
    leaves: list = []
    leaf_ids: set[int] = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        held.append(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            if id(variable) not in leaf_ids:
                leaf_ids.add(id(variable))
                leaves.append(variable)
            continue
        for child, _ in reversed(node.next_functions):
            if child is not None and id(child) not in seen:
                stack.append(child)
    return leaves


class _Leaves:
    """The hand loop's tensors, shaped as an optimizer (`param_groups`) so that the recorder names
    and digests them as it does an optimizer's parameters."""

    twice_unnamed = "tensor"

    def __init__(self, params: list):
        self.param_groups = [{"params": params}]


class HandSteps:
    """The open hand-updated step: its leaves as the last backward left them."""

    def __init__(self) -> None:
        self.leaves: _Leaves | None = None
        self.open = False  # a backward has ended since the last step ended
        self.confirmed = False  # a step has ended by a hand update: this is a hand loop
        self._marks: list[tuple[int, int, int]] = []
        self.grad_digests: list[tuple[str, str]] = []
        self.grad_squares: list = []
        self.params_before: str | None = None  # the first step's parameters before its update
        self.losses = 0  # of the recorder's pending losses and batches, how many are this step's
        self.batches = 0
        self._hook = None

    def backward_starts(self, tensors: Any) -> None:
        """A backward call begins: a new step's first one walks its graph for the leaves."""
        if self.open:
            return
        found = graph_leaves(tensors)
        if self.leaves is None or list(map(id, self.params)) != list(map(id, found)):
            self.leaves = _Leaves(found)  # a new holder: ParamNames names it afresh

    def backward_ended(self, losses: int, batches: int) -> None:
        """The backward call ended: remember the counters an update would change."""
        self.open = True
        self.losses, self.batches = losses, batches
        self._marks = [_mark(t) for t in self.params]

    @property
    def params(self) -> list:
        """The tensors the open step's backward produced gradients for."""
        return self.leaves.param_groups[0]["params"] if self.leaves is not None else []

    def updated(self) -> bool:
        """Have the leaves (or their gradients) changed since the last backward ended?"""
        if not self.open:
            return False
        for tensor, mark in zip(self.params, self._marks):
            if _mark(tensor) != mark:
                return True
        return False

    def watch_forward(self, check) -> None:
        """Call `check` at the next module forward (until `unwatch`): the earliest moment an
        update is certainly done, before the next step's forward draws random numbers."""
        if self._hook is None:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._hook = register_module_forward_pre_hook(lambda module, args: check())

    def unwatch(self) -> None:
        """Stop calling the forward check."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def close(self) -> None:
        """The step ended: the next backward starts the next one."""
        self.open = False
        self.unwatch()
        self.grad_digests, self.grad_squares = [], []


def _mark(tensor) -> tuple[int, int, int]:
    grad = tensor.grad
    if grad is None:
        return (tensor._version, 0, -1)
    # A sparse gradient (nn.Embedding(sparse=True)) has no data pointer of its own: its identity.
    where = id(grad) if grad.is_sparse else grad.data_ptr()
    return (tensor._version, where, grad._version)
