"""Replica consistency under torch.distributed: data-parallel ranks must hold identical parameters.

Every `every` steps each rank all-gathers its parameters' 128-bit digest. The gather is
asynchronous and its result is read at the next check, so the collective's latency overlaps
training instead of adding to it. On a desync: stop (`ReplicaDesync`) or warn, naming the step,
the first rank that differs from rank 0 and its first differing tensor.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

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
        self, step: int, params_digest: str | None, params: list[tuple[str, str]]
    ) -> None:
        """Called as each recorded step ends: read the check in flight, start the next one when
        due."""
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

        # The 128-bit digest as two int64 words: a tensor all-gather, far cheaper than pickled
        # objects.
        value = int(params_digest, 16)
        words = [(value >> 64) & (2**64 - 1), value & (2**64 - 1)]
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        local = torch.tensor(
            [w - 2**64 if w >= 2**63 else w for w in words], dtype=torch.int64, device=device
        )
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        work = dist.all_gather(parts, local, async_op=True)
        self.pending = (work, parts, step, dict(params))

    def resolve(self) -> None:
        """Read the result of the check in flight, if any; on a desync stop (or warn)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        import torch.distributed as dist

        work, parts, step, table = pending
        work.wait()
        gathered = [tuple(p.tolist()) for p in parts]
        if len(set(gathered)) == 1:
            return
        # Desync: name the first rank that differs from rank 0, and its first differing tensor.
        tables = [None] * dist.get_world_size()
        dist.all_gather_object(tables, table)
        bad_rank = next(r for r, d in enumerate(gathered) if d != gathered[0])
        tensor = next(
            (name for name in tables[0] if tables[bad_rank].get(name) != tables[0][name]), None
        )
        since = "" if self.every == 1 else f" (the check at step {step - self.every} agreed)"
        message = (
            f"replicas out of sync at step {step}: rank {bad_rank} holds different parameters "
            f"from rank 0, first in {tensor}{since}"
        )
        if dist.get_rank() == 0:
            write_json_atomic(
                RunFolder(self.run_dir).replicas,
                {"step": step, "rank": bad_rank, "tensor": tensor, "message": message},
            )
        if self.mode == "stop":
            raise ReplicaDesync(f"twice: {message}")
        warnings.warn(f"twice: {message}", RuntimeWarning, stacklevel=2)

    def finish(self) -> None:
        """The last check, unless the process group is gone already."""
        if self.pending is None:
            return
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                self.resolve()
        except RuntimeError as exc:
            print(exc, file=sys.stderr, flush=True)
        self.pending = None
