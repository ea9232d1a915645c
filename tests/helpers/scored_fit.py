"""A real Lightning fit whose validation figure is set per step: a one-weight module that validates
to ``figure(global_step)`` and whose weight records the step it was saved at (topic import)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from helpers.trainers import quiet_cpu_trainer

METRIC = "val/replay_accept_len"


class Scored(L.LightningModule):
    """Validates to ``figure(global_step)``; its weight records the step it was saved at."""

    def __init__(self, figure):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.figure = figure

    def training_step(self, batch, _):
        return (self.w - 1.0).pow(2).sum() + 0 * batch[0].sum()

    def on_train_batch_end(self, *_):
        with torch.no_grad():
            self.w.fill_(float(self.global_step))

    def validation_step(self, batch, _):
        self.log(METRIC, float(self.figure(self.global_step)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def scored_fit(tmp_path: Path, figure, max_steps: int = 5, interval: int = 2, top_k: int = 1, callbacks=()):
    """(checkpoint, trainer) of a fit of ``max_steps`` validated every ``interval`` steps, then
    validated once more as train.py does after a stale fit."""
    data = DataLoader(TensorDataset(torch.zeros(max(64, max_steps), 1)), batch_size=1)
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path,
        filename="best-step{step}",
        monitor=METRIC,
        mode="max",
        save_top_k=top_k,
        auto_insert_metric_name=False,
    )
    trainer = quiet_cpu_trainer(
        max_steps=max_steps,
        val_check_interval=interval,
        limit_val_batches=1,
        callbacks=[checkpoint, *callbacks],
        enable_checkpointing=True,
        num_sanity_val_steps=0,
    )
    module = Scored(figure)
    trainer.fit(module, train_dataloaders=data, val_dataloaders=data)
    trainer.validate(module, dataloaders=data, verbose=False)  # what train.py runs after a stale fit
    return checkpoint, trainer
