"""`twice.Run`: the library API for training loops that want more than the launcher gives.

Under `twice run` a Run joins the launcher's run folder (the launcher already seeded and
recorded the process); on its own it creates a run folder, applies deterministic mode, writes
the manifest and records the trace itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from twice.core.protocol import ChildSettings
from twice.record import hooks
from twice.record.recorder import Recorder
from twice.runtime.determinism import deterministic
from twice.store.layout import RunFolder
from twice.store.runs import write_json_atomic

__all__ = ["Run", "checkpoint_dir"]


def checkpoint_dir() -> Path:
    """Where a script that writes its own checkpoints should keep them: the run's folder under
    `twice run` (so that `twice verify-resume` can interrupt and resume it), else ./checkpoints."""
    return Path(ChildSettings.read(os.environ, "checkpoint_dir") or "checkpoints")


class Run:
    """A recorded run. Use as a context manager; call `step()` in loops without torch.optim.

    >>> import torch, twice
    >>> with twice.Run(runs_dir=tmp, determinism="warn") as run:   # doctest: +SKIP
    ...     for x in data:
    ...         loss = model(x).sum(); loss.backward()
    ...         manual_sgd(model)
    ...         run.step(loss=loss, batch=x, model=model)
    """

    def __init__(
        self,
        *,
        config: dict | None = None,
        seed: int = 0,
        runs_dir: str | Path = "runs",
        name: str | None = None,
        determinism: str = "strict",
        trace_every: int = 1,
        params_every: int | None = None,
        keep_last: int | None = 3,
        resume_world_size_change: bool = False,
        portable: bool = False,
    ):
        self.config = dict(config or {})
        self.seed = seed
        self.runs_dir = Path(runs_dir)
        self.name = name
        self.determinism = determinism
        self.trace_every = trace_every
        self.params_every = params_every
        self.dir: Path | None = None
        self._manifest: dict | None = None
        self._recorder: Recorder | None = None
        self._owns_recorder = False
        self._report = None
        self._tracked: dict[str, Any] = {}
        self.keep_last = keep_last
        self._saved_step: int | None = None  # the step of the loop's last checkpoint()
        self.epoch = 0
        self._resumed_from: Path | None = None
        self.resume_world_size_change = resume_world_size_change
        self.portable = portable

    @property
    def under_launcher(self) -> bool:
        """Whether this process runs under `twice run` (which then owns seeding and recording)."""
        return bool(ChildSettings.read(os.environ, "run_dir"))

    @property
    def step_index(self) -> int:
        """How many steps (rounds of optimizer updates) have completed: 0 before the first
        `optimizer.step()`, 1 after it; also the index of the next step. A checkpoint taken now
        is named after it and resumes at it."""
        return self._recorder.completed_steps if self._recorder is not None else 0

    def __enter__(self) -> Run:
        from twice.app.manifests import start_manifest
        from twice.app.options import RunOptions
        from twice.store.runs import new_run_dir

        if self.under_launcher:
            settings = ChildSettings.from_env(os.environ)
            self.dir = Path(settings.run_dir)
            if self.config:
                write_json_atomic(RunFolder(self.dir).config, self.config)
            self._recorder = hooks.active_recorder()
            if self._recorder is None:  # torch capture disabled: record explicitly ourselves
                self._recorder = hooks.install(
                    Recorder.from_settings(
                        self.dir,
                        settings,
                        trace_every=self.trace_every,
                        params_every=self.params_every,
                    )
                )
                self._owns_recorder = True
            self._recorder.on_stop.append(self._checkpoint_at_stop)
            return self
        self.dir = new_run_dir(self.runs_dir, self.name)
        self._report = deterministic(seed=self.seed, mode=self.determinism, portable=self.portable)
        options = RunOptions(
            portable=("strict" if self.determinism == "strict" else "warn")
            if self.portable
            else None,
            seed=self.seed,
            name=self.name,
            runs_dir=self.runs_dir,
            determinism=self.determinism,
            trace_every=self.trace_every,
            params_every=self.params_every,
        )
        script = (
            Path(sys.argv[0])
            if sys.argv and sys.argv[0].endswith(".py") and Path(sys.argv[0]).is_file()
            else None
        )
        self._manifest = start_manifest(
            self.dir, list(sys.argv), script, Path.cwd(), options, dict(os.environ), self.runs_dir
        )
        if self.config:
            write_json_atomic(RunFolder(self.dir).config, self.config)
        self._recorder = hooks.install(
            Recorder(self.dir, trace_every=self.trace_every, params_every=self.params_every)
        )
        self._owns_recorder = True
        self._recorder.on_stop.append(self._checkpoint_at_stop)
        return self

    def step(
        self, *, loss: Any = None, batch: Any = None, model: Any = None, params: Any = None
    ) -> None:
        """Record one training step: the loss, the batch it consumed, and the model's parameters and
        gradients.

        `params` may be given instead of `model`: named (name, tensor) pairs or plain tensors.
        """
        if self._recorder is None:
            raise RuntimeError("Run.step() called outside `with twice.Run(...)`")
        named = None
        if model is not None:
            named = list(model.named_parameters())
        elif params is not None:
            named = [
                (p[0], p[1]) if isinstance(p, tuple) else (f"param{i}", p)
                for i, p in enumerate(params)
            ]
        self._recorder.record_explicit(loss=loss, batch=batch, params=named)

    # -- checkpoint and resume -------------------------------------------------------------------
    def track(self, **objects: Any) -> None:
        """Register what a checkpoint must hold: models, optimizers, schedulers, GradScalers,
        loaders,
        generators (torch or NumPy), anything with state_dict/load_state_dict. Global RNGs,
        step and epoch counters and the trace position are always included."""
        for name in objects:
            if name.startswith("__"):
                raise ValueError(f"tracked names cannot start with '__': {name!r}")
        self._tracked.update(objects)

    @property
    def checkpoints_dir(self) -> Path:
        """Where this run's checkpoints go: the run folder's checkpoints/."""
        return RunFolder(self.dir).checkpoints

    def checkpoint(self, **extras: Any) -> Path:
        """Save every tracked object, every RNG, the counters and `extras` as checkpoints/step-<n>.

        Under torch.distributed every rank must call it (as with any collective): each rank saves
        its own RNG states, data position and tracked objects, and the checkpoint counts as complete
        only when every rank's part is in."""
        from twice.rng.seeding import capture_rng

        if self.dir is None:
            raise RuntimeError("Run.checkpoint() called outside `with twice.Run(...)`")
        self._saved_step = self.step_index
        return self._save(extras, capture_rng())

    def _save(self, extras: dict, rng: dict) -> Path:
        import twice.checkpoint as checkpoints

        counters = {"step": self.step_index, "epoch": self.epoch}
        return checkpoints.save(
            checkpoints.step_dir(self.checkpoints_dir, self.step_index),
            keep_last=self.keep_last,
            collective=True,
            **self._tracked,
            __extras__=extras,
            __counters__=counters,
            __rng__=rng,
        )

    def resume(self, path: str | Path | None = None, *, strict: bool = True) -> dict | None:
        """Restore the latest valid checkpoint (or `path`); returns its extras, or None when there
        is none.

        Under `twice run --resume` / `twice verify-resume` the checkpoint to resume from is given by
        the launcher; otherwise this run's own latest checkpoint is used (a no-op on a fresh run).
        """
        import twice.checkpoint as checkpoints
        from twice.checkpoint.folder import INDEX
        from twice.rng.seeding import restore_rng

        if path is None:
            path = ChildSettings.from_env(os.environ).resume_from or checkpoints.latest(
                self.checkpoints_dir
            )
        if path is None:
            return None
        path = Path(path)
        if not (path / INDEX).exists() and checkpoints.list_checkpoints(path):
            path = (
                checkpoints.latest(path) or path
            )  # a checkpoints folder: take its newest valid one
        restored = checkpoints.load(
            path, strict=strict, world_size_change=self.resume_world_size_change, **self._tracked
        )
        counters, rng = restored.get("__counters__"), restored.get("__rng__")
        if not (
            isinstance(counters, dict)
            and type(counters.get("step")) is int
            and "epoch" in counters
            and isinstance(rng, dict)
        ):
            raise checkpoints.CheckpointError(
                f"checkpoint {path} holds no step counters and RNG states of twice.Run",
                "resume from a checkpoint written by run.checkpoint(); load others with "
                "twice.checkpoint.load",
            )
        self.epoch = counters["epoch"]
        if self._recorder is not None:
            self._recorder.resume_at(counters["step"], source=path)
        # RNGs last: restoring other objects must not consume random numbers after them.
        try:
            restore_rng(rng)
        except (TypeError, ValueError, RuntimeError, KeyError, IndexError) as exc:
            raise checkpoints.CheckpointError(
                f"checkpoint {path} holds RNG states this process cannot take: {exc}",
                "the checkpoint is damaged or crafted: restore an earlier one",
            ) from exc
        self._resumed_from = path
        return restored.get("__extras__", {})

    def _checkpoint_at_stop(self) -> None:
        # The loop's own checkpoint of this step, if it made one, stands: it is the one the
        # uninterrupted run wrote too (taken where the script takes it, after any draws the step
        # makes past optimizer.step()), so a stopped run's checkpoints match the straight run's.
        if self._tracked and self._saved_step != self.step_index:
            # The RNGs as the last step ended (see Recorder.rng_at_stop), the rest as it is now.
            from twice.rng.seeding import capture_rng

            stopped_rng = self._recorder.rng_at_stop if self._recorder is not None else None
            self._save({}, stopped_rng if stopped_rng is not None else capture_rng())

    def __exit__(self, exc_type, exc, tb) -> None:
        from twice.app.manifests import finish_manifest
        from twice.app.trust import sign_manifest

        try:
            if self._owns_recorder:
                hooks.uninstall()
            if self._manifest is not None:
                if exc_type is None or (exc_type is SystemExit and not getattr(exc, "code", 0)):
                    code, interrupted = 0, False
                else:
                    code, interrupted = 1, exc_type is KeyboardInterrupt
                self._manifest["identity"]["torch"] = _torch_facts()
                finish_manifest(self.dir, self._manifest, code, interrupted)
                self._manifest["context"]["steps"] = self.step_index
                write_json_atomic(RunFolder(self.dir).manifest, sign_manifest(self._manifest))
        finally:
            if self._report is not None:
                self._report.restore()


def _torch_facts() -> dict:
    from twice.runtime.capture import torch_facts

    torch = sys.modules.get("torch")
    return torch_facts(torch) if torch is not None else {}
