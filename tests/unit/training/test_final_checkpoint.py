"""A fit that stops between validations (max_steps not a multiple of the interval, max_time): its
last head is validated after the fit and kept as the best checkpoint when it beats the ones
ModelCheckpoint saved at the fit's own validations (eagle3/training/final_checkpoint.py). A real
Lightning Trainer and ModelCheckpoint, a small module whose validation figure is set per step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.scored_fit import scored_fit as fit

from eagle3.training.final_checkpoint import keep_final_if_best


def saved_step(path: str) -> int:
    return int(torch.load(path, weights_only=False)["state_dict"]["w"].item())


def test_a_better_last_head_becomes_the_exported_best(tmp_path):
    checkpoint, trainer = fit(tmp_path, figure=lambda step: step)  # improves every step
    assert Path(checkpoint.best_model_path).name == "best-step4.ckpt"  # the fit's last validation
    saved = keep_final_if_best(checkpoint, trainer)
    assert saved == tmp_path / "best-step5.ckpt"
    assert checkpoint.best_model_path == str(saved) and float(checkpoint.best_model_score) == 5.0
    assert saved_step(checkpoint.best_model_path) == 5
    assert sorted(p.name for p in tmp_path.glob("best-*.ckpt")) == ["best-step5.ckpt"]  # top-1: step 4's gone
    assert keep_final_if_best(checkpoint, trainer) is None  # saved at this step already


def test_a_worse_last_head_leaves_the_best_alone(tmp_path):
    checkpoint, trainer = fit(tmp_path, figure=lambda step: -abs(step - 2))  # best at step 2
    assert keep_final_if_best(checkpoint, trainer) is None
    assert Path(checkpoint.best_model_path).name == "best-step2.ckpt" and saved_step(checkpoint.best_model_path) == 2
    assert not (tmp_path / "best-step5.ckpt").exists()


@pytest.mark.parametrize(
    ("figures", "kept"), [((1, 3, 2), ["best-step4", "best-step5"]), ((3, 2, 1), ["best-step2", "best-step4"])]
)
def test_top_k_keeps_the_k_best_with_the_last_head_among_them(tmp_path, figures, kept):
    by_step = {2: figures[0], 4: figures[1], 5: figures[2]}
    checkpoint, trainer = fit(tmp_path, figure=lambda step: by_step[step], top_k=2)
    keep_final_if_best(checkpoint, trainer)
    assert sorted(p.stem for p in tmp_path.glob("best-*.ckpt")) == kept
    assert sorted(Path(p).stem for p in checkpoint.best_k_models) == kept
    best = max(by_step, key=lambda step: by_step[step])
    assert Path(checkpoint.best_model_path).stem == f"best-step{best}"
