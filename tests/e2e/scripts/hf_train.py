# A tiny causal language model built from a config (no downloads), trained with the Hugging Face
# Trainer on CPU; dropout draws from the global RNG, the sampler shuffles.
# As a script: python hf_train.py OUTPUT_DIR MAX_STEPS [RESUME_CHECKPOINT]
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (48, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StopAt(TrainerCallback):
    """An interruption: save a checkpoint after step `step` and stop, the schedule still planned for max_steps."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = control.should_training_stop = True


def fit(output_dir, max_steps, *, callbacks=(), stop_at=None, resume=None, seed=0, **overrides):
    """Train a fresh tiny GPT-2 for `max_steps` steps (or stop after `stop_at`, saving); return its parameters."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.1,
                        embd_pdrop=0.1, attn_pdrop=0.1)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=8,
                             learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, logging_strategy="no",
                             save_strategy="no",
                             report_to=[], seed=seed, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                             **overrides)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=list(callbacks) + ([StopAt(stop_at)] if stop_at else []))
    trainer.train(resume_from_checkpoint=resume)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


if __name__ == "__main__":
    fit(sys.argv[1], int(sys.argv[2]), resume=sys.argv[3] if len(sys.argv) > 3 else None)
