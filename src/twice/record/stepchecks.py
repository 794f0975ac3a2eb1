"""The checks that run after each recorded step: the cheap always-on numerics check (loss,
gradients, learning rates and parameter norms: record/health.py) and, under torch.distributed,
the replica check (parameters that should be equal across ranks are: record/replicas.py).
"""

from __future__ import annotations

from pathlib import Path

from twice.core.records import StepRecord
from twice.record.health import StepHealth
from twice.record.openstep import StepRound
from twice.record.replicas import ReplicaCheck

__all__ = ["StepChecks", "PARAM_CHECK_EVERY"]

# The parameters' norm is taken every PARAM_CHECK_EVERY steps: inf or NaN iff some parameter is.
PARAM_CHECK_EVERY = 10


class StepChecks:
    """Health and replica checks of one process's steps. `health=False` turns the numerics check
    off, parameter norms included (bench/bench_numerics.py measures what it costs)."""

    def __init__(
        self, run_dir: Path, replica_every: int = 20, replica_mode: str = "stop", health=True
    ):
        """Checks writing to `run_dir`'s numerics log; replicas compared every `replica_every`
        steps, a desync handled by `replica_mode` (stop or warn)."""
        self.run_dir = run_dir
        self.health = health
        self.health_log: StepHealth | None = None  # made at the first recorded step
        self.replicas = ReplicaCheck(run_dir, replica_every, replica_mode)

    def param_norms_due(self, step: int) -> bool:
        """Whether step `step` takes the parameters' norm."""
        return self.health and step % PARAM_CHECK_EVERY == 0

    def after_record(self, record: StepRecord, round_: StepRound, losses: list[float]) -> None:
        """The cheap numerics check of a written record: loss, gradients and parameters."""
        if not self.health:
            return
        if self.health_log is None:
            self.health_log = StepHealth(self.run_dir)
        self.health_log.check(
            record.step,
            losses,
            round_.grads,
            round_.grad_norms,
            round_.grad_total,
            round_.skipped,
            round_.lr,
            round_.param_norm,
        )

    def after_step(self, step: int, round_: StepRound) -> None:
        """The replica check of step `step`'s parameters (a no-op outside torch.distributed)."""
        self.replicas.after_step(step, round_.params, round_.named)

    def forked(self) -> StepChecks:
        """Fresh checks for a forked child, with the same settings."""
        return StepChecks(self.run_dir, self.replicas.every, self.replicas.mode, self.health)

    def finish(self) -> None:
        """The process ends: the replica check's last word."""
        self.replicas.finish()
