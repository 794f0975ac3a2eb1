"""Lightning with twice.data.loader: the epochs, steps, limits, validation and resumes of a plain
DataLoader, batch for batch."""

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import twice

pl = pytest.importorskip("pytorch_lightning")

X = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4) / 100
DATA = TensorDataset(X, X.sum(1, keepdim=True))


def _loader(kind: str, shuffle: bool = False):
    if kind == "plain":
        return DataLoader(DATA, batch_size=8, shuffle=shuffle)
    return twice.data.loader(DATA, batch_size=8, shuffle=shuffle, seed=0)


class _Net(pl.LightningModule):
    def __init__(self, kind: str, shuffle: bool = False, val: bool = False):
        super().__init__()
        self.kind, self.shuffle, self.val = kind, shuffle, val
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[tuple[int, float]] = []  # (global step, first value of the batch)
        self.val_seen: list[float] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.trainer.global_step, float(batch[0][0, 0])))
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.val_seen.append(float(batch[0][0, 0]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return _loader(self.kind, self.shuffle)

    def val_dataloader(self):
        return _loader(self.kind) if self.val else []


def _fit(kind: str, *, shuffle=False, val=False, resume=None, callbacks=(), **trainer_kwargs):
    torch.manual_seed(0)
    net = _Net(kind, shuffle, val)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        num_sanity_val_steps=0,
        **trainer_kwargs,
    )
    trainer.fit(net, ckpt_path=resume)
    return net, trainer


@pytest.mark.parametrize(
    "settings",
    [
        {"max_epochs": 4},
        {"max_steps": 20},
        {"max_epochs": 3, "limit_train_batches": 0.5},
        {"max_epochs": 2, "val": True, "val_check_interval": 0.5},
    ],
    ids=["max_epochs", "max_steps", "limit_train_batches", "validation"],
)
def test_the_loader_trains_the_steps_and_batches_a_plain_dataloader_does(settings):
    plain, plain_trainer = _fit("plain", **settings)
    ours, our_trainer = _fit("twice", **settings)
    assert our_trainer.global_step == plain_trainer.global_step
    assert our_trainer.current_epoch == plain_trainer.current_epoch
    assert ours.seen == plain.seen  # unshuffled, both serve the same batches at the same steps
    assert ours.val_seen == plain.val_seen


def test_a_mid_epoch_resume_continues_with_the_batches_of_the_uninterrupted_run(tmp_path):
    straight, trainer = _fit("twice", shuffle=True, max_epochs=2)
    assert trainer.global_step == 16 and len(straight.seen) == 16
    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    _fit("twice", shuffle=True, max_steps=3, callbacks=[saver])
    (checkpoint,) = Path(tmp_path).glob("*step=3.ckpt")
    resumed, trainer = _fit(
        "twice",
        shuffle=True,
        max_epochs=2,
        resume=str(checkpoint),
        callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "again")],
    )
    assert trainer.global_step == 16
    assert resumed.seen == straight.seen[3:]  # from step 3 on, batch for batch


def test_the_callback_is_accepted_by_the_lightning_package_and_the_legacy_one(tmp_path):
    lightning = pytest.importorskip("lightning.pytorch")
    from twice.integrations.lightning import Twice

    class Net(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = Twice(runs_dir=tmp_path / "runs", name="new")
    assert isinstance(callback, lightning.Callback) and isinstance(callback, pl.Callback)
    trainer = lightning.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback],
    )
    trainer.fit(Net(), train_dataloaders=_loader("twice"))
    trace = (callback.run_dir / "trace.jsonl").read_text().splitlines()
    assert len(trace) == 3
