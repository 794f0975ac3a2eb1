"""Data-parallel training whose parameters do not depend on the number of processes.

Plain data parallelism (DDP) all-reduces gradients that each rank summed over its share of the
batch, so the order of the floating-point additions, and with it the trained bits, change with
the world size. `InvariantDataParallel` fixes that order instead:

1. The global batch is cut into `micro_batches` equal slices, always the same ones. Rank r of W
   computes the gradient of slices [r*M/W, (r+1)*M/W), one slice at a time, each under its own
   RNG stream derived from (seed, step, slice): dropout does not depend on who computes a slice.
2. The M slice gradients are added in one fixed pairwise tree over the slice indices. Each rank
   adds the subtrees that lie entirely in its share; the subtree sums are exchanged with an
   all-gather (which moves bits without adding them), and every rank adds the remaining levels
   of the same tree in the same order.

Each addition therefore happens on the same operands in the same order at any world size, so 1, 2
or 4 processes (any W dividing M) train bit-identical parameters. The price: M small backward
passes instead of one per rank, an all-gather instead of an all-reduce, and no overlap of
communication with the backward pass. `bench/bench_invariant.py` measures it against DDP.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twice.core.protocol import ChildSettings
from twice.core.seeds import derive_seed

__all__ = ["InvariantDataParallel", "tree_nodes"]


def _split(lo: int, hi: int) -> int:
    return (lo + hi) // 2


def tree_nodes(lo: int, hi: int, owned: tuple[int, int]) -> list[tuple[int, int]]:
    """The largest subtrees of the fixed pairwise tree over [lo, hi) that lie inside `owned`,
    left to right."""
    a, b = owned
    if b <= lo or hi <= a:
        return []
    if a <= lo and hi <= b:
        return [(lo, hi)]
    mid = _split(lo, hi)
    return tree_nodes(lo, mid, owned) + tree_nodes(mid, hi, owned)


def _tree_sum(lo: int, hi: int, value: Callable[[int, int], Any | None]) -> Any:
    """Sum of the leaves [lo, hi) in the fixed tree order; `value(lo, hi)` supplies known subtree
    sums."""
    known = value(lo, hi)
    if known is not None:
        return known
    mid = _split(lo, hi)
    return _tree_sum(lo, mid, value) + _tree_sum(mid, hi, value)


def _slice_batch(batch: Any, index: int, count: int) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        size = batch.shape[0] // count
        return batch[index * size : (index + 1) * size]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice_batch(b, index, count) for b in batch)
    if isinstance(batch, dict):
        return {k: _slice_batch(v, index, count) for k, v in batch.items()}
    return batch


def _batch_size(batch: Any) -> int | None:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    values = (
        batch.values()
        if isinstance(batch, dict)
        else batch
        if isinstance(batch, (list, tuple))
        else ()
    )
    sizes = {s for s in (_batch_size(v) for v in values) if s is not None}
    if len(sizes) > 1:
        raise ValueError(f"the batch's tensors disagree on the batch size: {sorted(sizes)}")
    return sizes.pop() if sizes else None


class InvariantDataParallel:
    """Wrap `module` for training whose result is bit-identical at any world size dividing
    `micro_batches`.

    Every rank passes the same *global* batch; each computes only its share of it.

    >>> model = twice.parallel.InvariantDataParallel(net, micro_batches=8)      # doctest: +SKIP
    >>> for x, y in loader:                       # the same global batches on every rank
    ...     opt.zero_grad()
    ...     loss = model.backward((x, y), lambda net, mb: F.cross_entropy(net(mb[0]), mb[1]))
    ...     opt.step()

    `loss_fn(module, micro_batch)` returns the mean loss of one micro-batch; the gradients left in
    the parameters are those of the mean over the global batch. Parameters are broadcast from
    rank 0 on construction. The thread count and device kind must match across the runs compared
    (as for any bitwise comparison).
    """

    def __init__(
        self, module: Any, *, micro_batches: int, seed: int | None = None, process_group: Any = None
    ):
        import torch
        import torch.distributed as dist

        if micro_batches < 1:
            raise ValueError(f"micro_batches must be at least 1, not {micro_batches}")
        self.module = module
        self.micro_batches = micro_batches
        self.group = process_group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if self.distributed else 0
        self.world_size = dist.get_world_size(process_group) if self.distributed else 1
        if micro_batches % self.world_size:
            raise ValueError(
                f"micro_batches={micro_batches} is not a multiple of the world size "
                f"{self.world_size}; "
                "choose a micro-batch count that every world size you compare divides (e.g. 8 "
                "for 1, 2, 4, 8)"
            )
        root = (ChildSettings.read(os.environ, "seed") or 0) if seed is None else seed
        self.seed = derive_seed(root, "micro-batches")
        self.steps = 0
        self.params = [p for p in module.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ValueError(
                f"InvariantDataParallel needs parameters of one dtype, found "
                f"{sorted(map(str, dtypes))}"
            )
        if self.distributed and self.world_size > 1:
            with torch.no_grad():
                for tensor in list(module.parameters()) + list(module.buffers()):
                    dist.broadcast(
                        tensor,
                        src=dist.get_global_rank(process_group, 0) if process_group else 0,
                        group=process_group,
                    )
        share = micro_batches // self.world_size
        self.owned = (self.rank * share, (self.rank + 1) * share)
        # The subtrees each rank adds by itself; the all-gather carries as many slots as the most
        # any rank has.
        self._rank_nodes = [
            tree_nodes(0, micro_batches, (r * share, (r + 1) * share))
            for r in range(self.world_size)
        ]
        self._nodes = self._rank_nodes[self.rank]
        self._slots = max(len(nodes) for nodes in self._rank_nodes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def state_dict(self) -> dict:
        """The wrapped module's state, without the wrapper's prefix."""
        return {"module": self.module.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> Any:
        """Load into the wrapped module."""
        self.steps = int(state["steps"])
        return self.module.load_state_dict(state["module"])

    def _micro_gradient(self, batch: Any, index: int, loss_fn: Callable) -> Any:
        """Flat [gradient..., loss] of micro-batch `index`, computed under that micro-batch's own
        RNG."""
        import torch

        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        seed = derive_seed(self.seed, self.steps, index)
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
            # Not torch.manual_seed: without CUDA up it queues a lazy CUDA call, stack trace
            # included, each time.
            torch.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.manual_seed(seed)
            for p in self.params:
                p.grad = None
            loss = loss_fn(self.module, _slice_batch(batch, index, self.micro_batches))
            loss.backward()
        parts = [
            p.grad.reshape(-1)
            if p.grad is not None
            else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
            for p in self.params
        ]
        parts.append(loss.detach().reshape(1).to(self.params[0].dtype))
        return torch.cat(parts)

    def backward(self, batch: Any, loss_fn: Callable[[Any, Any], Any]) -> Any:
        """Leave in every parameter's .grad the gradient of the mean loss over the global
        `batch`; return that loss."""
        import torch
        import torch.distributed as dist

        size = _batch_size(batch)
        if size is None or size % self.micro_batches:
            raise ValueError(
                f"a global batch of {size} samples does not split into {self.micro_batches} "
                f"equal micro-batches"
            )
        leaves: dict[int, Any] = {}

        def local(lo: int, hi: int) -> Any:
            if hi - lo == 1:
                if lo not in leaves:
                    leaves[lo] = self._micro_gradient(batch, lo, loss_fn)
                return leaves[lo]
            return None

        sums = [_tree_sum(lo, hi, local) for lo, hi in self._nodes]
        if self.world_size > 1:
            slots = torch.zeros(
                self._slots, sums[0].numel(), dtype=sums[0].dtype, device=sums[0].device
            )
            for i, s in enumerate(sums):
                slots[i] = s
            gathered = [torch.empty_like(slots) for _ in range(self.world_size)]
            dist.all_gather(gathered, slots, group=self.group)
            known = {
                node: block[i]
                for block, nodes in zip(gathered, self._rank_nodes)
                for i, node in enumerate(nodes)
            }
            total = _tree_sum(0, self.micro_batches, lambda lo, hi: known.get((lo, hi)))
        else:
            total = sums[0]  # one process owns the whole tree
        mean = total / self.micro_batches
        offset = 0
        for p in self.params:
            p.grad = mean[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        self.steps += 1
        return mean[offset]
