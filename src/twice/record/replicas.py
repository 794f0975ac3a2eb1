"""Replica consistency under torch.distributed: data-parallel ranks must hold identical parameters.

Every `every` steps each rank all-gathers its parameters' 128-bit digest, one per class of
tensors that share their placements (record/sharding.py: a plain tensor is compared across the
world, a DTensor's shard across the ranks that hold copies of it, a tensor sharded everywhere not
at all). The gather is
asynchronous and its result is read at the next check, so the collective's latency overlaps
training instead of adding to it. On a desync: stop (`ReplicaDesync`) or warn, naming the step,
the first rank that differs from rank 0 and its first differing tensor.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from twice.core.escaping import escape_controls
from twice.record.sharding import replica_classes
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder

__all__ = ["ReplicaDesync", "ReplicaCheck"]


class ReplicaDesync(RuntimeError):
    """Data-parallel replicas hold different parameters (raised on purpose, to stop the run)."""


class ReplicaCheck:
    """The periodic cross-rank comparison of one process's parameter digests."""

    def __init__(self, run_dir: Path, every: int = 20, mode: str = "stop"):
        self.run_dir = Path(run_dir)
        self.every = max(1, int(every))
        self.mode = mode
        self.pending: tuple | None = None  # the check in flight

    def after_step(
        self, step: int, params: list[tuple[str, str]], named: list[tuple[str, Any]]
    ) -> None:
        """Called as each recorded step ends, with the step's (name, digest) and (name, tensor)
        pairs of its parameters: read the check in flight, start the next one when due."""
        if self.pending is None and step % self.every:
            # neither a check to read nor one due (most steps: before any call into
            # torch.distributed)
            return
        dist = sys.modules.get("torch.distributed")  # loaded with torch; not re-imported every step
        if (
            dist is None
            or not (dist.is_available() and dist.is_initialized())
            or dist.get_world_size() < 2
        ):
            return
        self.resolve()
        if not params or step % self.every:
            return
        import torch

        table = dict(params)
        classes = replica_classes(named, table, dist)
        if not classes:
            return  # every parameter is sharded over its whole mesh: nothing has a replica
        # Each class's digest and group as three int64 words: a tensor all-gather, far cheaper
        # than pickled objects.
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        local = torch.tensor(
            [w for found in classes for w in found.words()], dtype=torch.int64, device=device
        )
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        work = dist.all_gather(parts, local, async_op=True)
        self.pending = (
            work,
            parts,
            step,
            table,
            [(found.key, [name for name, _ in found.pairs]) for found in classes],
        )

    def resolve(self) -> None:
        """Read the result of the check in flight, if any; on a desync stop (or warn)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        import torch.distributed as dist

        work, parts, step, table, classes = pending
        work.wait()
        found = _first_desync([p.tolist() for p in parts], len(classes))
        if found is None:
            return
        index, bad_rank, reference = found
        # Name the first tensor of that class that differs between the two ranks (only tensors
        # of that class: the others may be shards, different on every rank by design).
        key, names = classes[index]
        tables = [None] * dist.get_world_size()
        dist.all_gather_object(tables, table)
        tensor = next(
            (n for n in names if tables[bad_rank].get(n) != tables[reference].get(n)), None
        )
        since = "" if self.every == 1 else f" (the check at step {step - self.every} agreed)"
        what = "" if key == "replicated" else f" among those placed {key}"
        message = (
            f"replicas out of sync at step {step}: rank {bad_rank} holds different parameters "
            f"from rank {reference}{what}, first in {tensor}{since}"
        )
        if dist.get_rank() == 0:
            write_json_atomic(
                RunFolder(self.run_dir).replicas,
                {"step": step, "rank": bad_rank, "tensor": tensor, "message": message},
            )
        if self.mode == "stop":
            raise ReplicaDesync(f"twice: {message}")
        warnings.warn(escape_controls(f"twice: {message}"), RuntimeWarning, stacklevel=2)

    def finish(self) -> None:
        """The last check, unless the process group is gone already."""
        if self.pending is None:
            return
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                self.resolve()
        except RuntimeError as exc:
            from twice.core.escaping import escape_controls

            sys.stderr.write(escape_controls(f"{exc}\n"))
            sys.stderr.flush()
        self.pending = None


def _first_desync(gathered: list[list[int]], count: int) -> tuple[int, int, int] | None:
    """(class index, rank, the rank it should equal) of the first replica that differs, or None.
    `gathered[r]` holds rank r's (digest high, digest low, group id) for each of `count`
    classes; ranks of one group must hold the same digest. The same answer on every rank."""
    for index in range(count):
        first: dict[int, tuple[int, tuple[int, int]]] = {}
        for rank, words in enumerate(gathered):
            high, low, group = words[3 * index : 3 * index + 3]
            reference = first.setdefault(group, (rank, (high, low)))
            if reference[1] != (high, low):
                return index, rank, reference[0]
    return None
