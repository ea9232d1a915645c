"""A real Lightning Trainer on the CPU that prints and writes nothing of its own (topic import):
no logger, checkpoints, progress bar or model summary unless the caller turns one back on."""

from __future__ import annotations

import lightning as L


def quiet_cpu_trainer(**options) -> L.Trainer:
    quiet = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    return L.Trainer(**{**quiet, **options})
