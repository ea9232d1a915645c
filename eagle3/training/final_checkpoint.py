"""The head of a fit's last step among the best checkpoints.

ModelCheckpoint saves at the fit's own validations (every ``train.val_check_interval`` steps). A fit
that stops between two of them (``train.max_steps`` not a multiple of the interval, ``train.max_time``,
a time budget) trains its last steps into a head that train.py validates after the fit, but
ModelCheckpoint never sees that validation: the export (the best checkpoint) would be the head of
the last interval, those steps thrown away: on one H100 the exported head was an earlier, weaker
one than the fit's last (docs/records/2026-12-01-make-demo.md shows the fix on the CPU demo)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


def keep_final_if_best(checkpoint: ModelCheckpoint, trainer: L.Trainer) -> Path | None:
    """Save the trainer's current head as ``best-step<N>.ckpt`` when its validated figure (the
    trainer's callback metric ``checkpoint.monitor``) is among ModelCheckpoint's top-k, dropping the
    k-th; update the callback's best path and score (what train.py exports and a resume reads).
    Returns the saved path, or None (already saved at this step, no figure, or not good enough)."""
    monitor, dirpath = checkpoint.monitor, checkpoint.dirpath
    score = trainer.callback_metrics.get(monitor) if monitor is not None else None
    if score is None or dirpath is None or not torch.isfinite(torch.as_tensor(score)):
        return None
    score = torch.as_tensor(score).detach().float().cpu()
    path = str(Path(dirpath) / f"best-step{trainer.global_step}.ckpt")
    kept = dict(checkpoint.best_k_models)
    if path in kept:
        return None

    def better(a: torch.Tensor, b: torch.Tensor) -> bool:  # strict, as ModelCheckpoint's: a tie keeps the earlier
        return bool(a > b) if checkpoint.mode == "max" else bool(a < b)

    dropped = None
    if len(kept) >= checkpoint.save_top_k:
        worst = next(iter(kept))
        for p, s in kept.items():
            if better(kept[worst], s):
                worst = p
        if not better(score, kept[worst]):
            return None
        dropped = worst
        del kept[worst]
    trainer.save_checkpoint(path)
    kept[path] = score
    best = worst = path
    for p, s in kept.items():
        best = p if better(s, kept[best]) else best
        worst = p if better(kept[worst], s) else worst
    checkpoint.best_k_models = kept
    checkpoint.best_model_path, checkpoint.best_model_score = best, kept[best]
    checkpoint.kth_best_model_path, checkpoint.kth_value = worst, kept[worst]
    if dropped is not None:
        trainer.strategy.remove_checkpoint(dropped)
    return Path(path)
