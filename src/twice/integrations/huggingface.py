"""Hugging Face Trainer: `Trainer(..., callbacks=[TwiceCallback()])` records the run as a twice run.

The Trainer's own checkpoints already hold what a bitwise resume needs: model, optimizer,
scheduler, its state, every process's RNG states (rng_state.pth, put back before the first resumed
step), and `resume_from_checkpoint` skips the batches the epoch had consumed. Tested here: an
interrupted and resumed tiny GPT-2 with dropout ends bit-identical to the uninterrupted one. The
callback adds the manifest, the recorded hyperparameters and the step trace, numbered so that a
resumed run's trace continues the interrupted one's and can be compared step by step with the
uninterrupted run (`twice.first_divergence`); that comparison shows what a resume lost, for
example the data position when `ignore_data_skip=True`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twice.integrations import require

transformers = require("huggingface", "transformers")

__all__ = ["TwiceCallback"]


def _config_of(args: Any) -> dict:
    """The TrainingArguments that are plain values (the recorded hyperparameters)."""
    out = {}
    for key, value in args.to_dict().items():
        if value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
    out.pop("output_dir", None), out.pop("logging_dir", None)  # where, not what
    return out


def _write_defaults(run_dir: Path, args: Any) -> None:
    """Record the TrainingArguments' defaults beside the config (config_defaults.json), so that
    `twice show` and `twice diff` put the settings that were chosen before the 100 defaults.
    Read from the dataclass's fields, never by making a TrainingArguments: making one resets
    Accelerate's state under the running Trainer. A default that is None (filled in by the
    arguments' own post-processing) is left out: its value says nothing about a choice."""
    import dataclasses

    from twice.store.files import write_json_atomic
    from twice.store.layout import RunFolder

    try:
        raw = object.__new__(type(args))
        for item in dataclasses.fields(args):
            if item.default is not dataclasses.MISSING:
                value = item.default
            elif item.default_factory is not dataclasses.MISSING:
                value = item.default_factory()
            else:
                value = None
            object.__setattr__(raw, item.name, value)
        defaults = {k: v for k, v in _config_of(raw).items() if v is not None}
    except Exception:  # noqa: BLE001 - arguments of another shape: shown unordered
        return
    write_json_atomic(RunFolder(run_dir).config_defaults, defaults)


class TwiceCallback(transformers.TrainerCallback):
    """Record training as a twice run (manifest, config, step trace) and resume it bit for bit.

    Under `twice run` the callback joins the launcher's run; on its own it creates a run folder
    under `runs_dir` and applies `determinism` when training begins, seeding with `seed` or, by
    default, the Trainer's own `TrainingArguments.seed`.
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        runs_dir: str | Path = "runs",
        name: str | None = None,
        determinism: str = "warn",
        trace_every: int = 1,
    ):
        self.seed, self.runs_dir, self.name = seed, runs_dir, name
        self.determinism, self.trace_every = determinism, trace_every
        self.run: Any = None
        self._dir: Path | None = None
        self._resume_step: int | None = None

    @property
    def run_dir(self) -> Path | None:
        """The run folder this training is recorded into (kept after training ends)."""
        return self.run.dir if self.run is not None else self._dir

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start the run (seeded, deterministic, recorded) once; note the step a resumed Trainer
        starts at."""
        from twice.app.run import Run

        if self.run is None:
            self.run = Run(
                config=_config_of(args),
                seed=self.seed if self.seed is not None else int(args.seed),
                runs_dir=self.runs_dir,
                name=self.name,
                determinism=self.determinism,
                trace_every=self.trace_every,
                keep_last=None,
            )
            self.run.__enter__()
            self._dir = self.run.dir
            _write_defaults(self.run.dir, args)
        if state.global_step > 0:
            self._resume_step = state.global_step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After a resume, continue the trace at the Trainer's step (once, at the first step)."""
        if self._resume_step is None:
            return
        from twice.record import hooks

        recorder = hooks.active_recorder()
        if recorder is not None:
            # The Trainer has fetched this step's batches already, after those it skipped to get
            # there.
            recorder.resume_at(
                self._resume_step,
                keep_batches=args.gradient_accumulation_steps,
                source=f"checkpoint-{self._resume_step}",  # the Trainer's name for it
            )
        self._resume_step = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Finish the run: the last step, the manifest's end."""
        if self.run is not None:
            run, self.run = self.run, None
            run.__exit__(None, None, None)
