"""The Hugging Face Trainer's callback: training begun is a twice run seeded with the Trainer's
seed, its TrainingArguments the run's config beside their defaults, finished when training ends
(the resume, bit for bit, with a real Trainer: tests/e2e/test_integrations.py)."""

import warnings

import pytest

from twice.store.reader import read_json
from twice.store.runs import read_manifest

transformers = pytest.importorskip("transformers")


@pytest.mark.slow  # TrainingArguments alone takes seconds to make (Accelerate's state)
def test_training_begun_and_ended_is_a_run_with_the_trainers_seed_and_config(tmp_path):
    from twice.integrations.huggingface import TwiceCallback

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), seed=7, learning_rate=3e-4, report_to=[]
    )
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    callback = TwiceCallback(runs_dir=tmp_path / "runs", name="hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # warn mode names what is not in effect
        callback.on_train_begin(args, state, control)
        callback.on_train_end(args, state, control)
    run = callback.run_dir
    assert run.parent == tmp_path / "runs" and run.name.endswith("-hf")
    manifest = read_manifest(run)
    assert manifest.seed == 7 and manifest.status == "completed"
    config, defaults = read_json(run / "config.json"), read_json(run / "config_defaults.json")
    assert config["learning_rate"] == 3e-4 and config["seed"] == 7
    assert "output_dir" not in config and defaults["learning_rate"] == 5e-5
