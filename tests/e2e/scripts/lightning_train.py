# A small LightningModule trained on CPU: dropout and input noise draw from the global RNG, the
# learning rate steps every 3 batches, and the data comes from twice's resumable loader.
# As a script: python lightning_train.py MAX_STEPS (what `twice run` is tested with).
import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import TensorDataset

import twice


class Net(pl.LightningModule):
    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x + 0.01 * torch.randn_like(x)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return [opt], [{"scheduler": torch.optim.lr_scheduler.StepLR(opt, 3, 0.5), "interval": "step"}]

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=g)
        return twice.data.loader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=8, shuffle=True, seed=0)


def fit(max_steps, *, callbacks=(), ckpt_dir=None, every=None, resume=None):
    """Train a fresh Net (seeded) for `max_steps` steps; return its parameters."""
    twice.seed_everything(0)
    model = Net()
    callbacks = list(callbacks)
    if ckpt_dir is not None:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=every, save_top_k=-1))
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=ckpt_dir is not None, callbacks=callbacks)
    trainer.fit(model, ckpt_path=resume)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


if __name__ == "__main__":
    fit(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
