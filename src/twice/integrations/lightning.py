"""PyTorch Lightning: `Trainer(callbacks=[Twice()])` records the run and makes its checkpoints
resume bit for bit.

Lightning checkpoints hold the model, optimizers, schedulers, loop counters and the state of
dataloaders that have one, but no RNG state: a resumed run draws other dropout masks and random
augmentations than the uninterrupted one. This callback adds every RNG (Python, NumPy, torch, the
accelerator's) to the checkpoint, and puts it back just before the first resumed batch, after
Lightning has rebuilt its dataloader iterators (which may draw random numbers themselves).

For the data position, give the Trainer a dataloader with state, such as `twice.data.loader(...)`:
Lightning saves and restores its position itself. A plain DataLoader restarts its epoch on resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twice.integrations import require

pl = require("lightning", "lightning.pytorch", "pytorch_lightning")

__all__ = ["Twice"]

FORMAT = "twice-lightning/1"


def _callback_bases() -> tuple[type, ...]:
    """Lightning's Callback class under each name installed: `lightning.pytorch` (the package
    `lightning`) and the legacy `pytorch_lightning`. Each Trainer accepts only its own package's
    callbacks, so with both installed the callback is both."""
    import importlib

    bases = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:
            continue
    return tuple(dict.fromkeys(bases)) or (pl.Callback,)


class Twice(*_callback_bases()):
    """Record the fit as a twice run (manifest, step trace) and keep every RNG in Lightning's
    checkpoints.

    Under `twice run` the callback joins the launcher's run; on its own it creates a run folder
    under `runs_dir` and applies `determinism` (seeding every RNG with `seed`) when fitting starts.
    Seed before building the model (`twice.seed_everything(seed)`) for the initial weights too.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        runs_dir: str | Path = "runs",
        name: str | None = None,
        determinism: str = "warn",
        trace_every: int = 1,
        config: dict | None = None,
    ):
        self.seed, self.runs_dir, self.name = seed, runs_dir, name
        self.determinism, self.trace_every, self.config = determinism, trace_every, config
        self.run: Any = None
        self._dir: Path | None = None
        self._pending: dict | None = None

    @property
    def state_key(self) -> str:
        """The key Lightning stores this callback's state under in its checkpoints."""
        return "twice"

    @property
    def run_dir(self) -> Path | None:
        """The run folder this training is recorded into (kept after fit returns)."""
        return self.run.dir if self.run is not None else self._dir

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Start the run (seeded, deterministic, recorded) when fitting starts."""
        from twice.app.run import Run

        if stage != "fit" or self.run is not None:
            return
        config = (
            self.config
            if self.config is not None
            else dict(getattr(pl_module, "hparams", {}) or {})
        )
        self.run = Run(
            config=config,
            seed=self.seed,
            runs_dir=self.runs_dir,
            name=self.name,
            determinism=self.determinism,
            trace_every=self.trace_every,
            keep_last=None,
        )
        self.run.__enter__()
        self._dir = self.run.dir

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Finish the run when fitting ends."""
        if stage == "fit" and self.run is not None:
            run, self.run = self.run, None
            run.__exit__(None, None, None)
            _say_where(run)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Mark the run failed and finish it when fitting raises."""
        if self.run is not None:
            run, self.run = self.run, None
            run.__exit__(type(exception), exception, exception.__traceback__)
            _say_where(run)

    def state_dict(self) -> dict:
        """Every RNG's state, for Lightning's checkpoint (restored by load_state_dict)."""
        from twice.checkpoint import encode_state
        from twice.rng.seeding import capture_rng

        return {"format": FORMAT, "rng": encode_state(capture_rng())}

    def load_state_dict(self, state_dict: dict) -> None:
        """Keep the RNG states from Lightning's checkpoint, put back at the first resumed batch."""
        from twice.checkpoint import decode_state

        if state_dict.get("format") == FORMAT:
            self._pending = decode_state(state_dict["rng"])

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """After a resume: continue the trace at Lightning's global step and restore the RNG
        states."""
        if self._pending is None:
            return
        from twice.record import hooks
        from twice.rng.seeding import restore_rng

        recorder = hooks.active_recorder()
        if recorder is not None:
            # The trace continues at the resumed step's number, with the batch Lightning already
            # fetched.
            recorder.resume_at(
                trainer.global_step,
                keep_batches=None,
                source=getattr(trainer, "ckpt_path", None) or f"step {trainer.global_step}",
            )
        restore_rng(self._pending)
        self._pending = None


def _say_where(run: Any) -> None:
    """One line on stderr naming the run folder, as `twice run` ends with (not under `twice run`,
    which says it itself)."""
    import sys

    from twice.core.escaping import escape_controls

    if not run.under_launcher:
        sys.stderr.write(escape_controls(f"twice: run recorded in {run.dir}\n"))
