"""Training safety through real train.py runs: a diverging loss stops training naming the step
before a checkpoint holds it; a rerun with a new lr is refused before any work."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import compose

from eagle3.training import run_dir

TINY = ["experiment=tiny_test"]


def test_a_non_finite_loss_stops_training_naming_the_step_before_a_checkpoint_holds_it(
    datasets_dir, tmp_path, monkeypatch
):
    from eagle3.stages.train import run as train
    from eagle3.training.module import Eagle3LitModule, NonFiniteLossError

    real = Eagle3LitModule._loss

    def loss_nan_from_step_4(self, *args, **kwargs):
        loss, counts = real(self, *args, **kwargs)
        if self.training and self.global_step >= 4:
            loss = loss * float("nan")
        return loss, counts

    monkeypatch.setattr(Eagle3LitModule, "_loss", loss_nan_from_step_4)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as e:
        train(compose("train", TINY + [f"paths.datasets_dir={datasets_dir}"], output_dir=str(out)))
    assert "train/loss: expected a finite value, got a non-finite one at step 4" in str(e.value)
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 3  # the validation's save; none after the NaN
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())
    assert not (out / "export").exists() and not (out / "summary.json").exists()
    # without the per-step check, the save itself refuses (the check before every checkpoint)
    monkeypatch.setattr(Eagle3LitModule, "on_train_batch_end", lambda *a, **k: None)
    out2 = tmp_path / "run2"
    with pytest.raises(NonFiniteLossError, match="at step 4"):
        train(compose("train", TINY + [f"paths.datasets_dir={datasets_dir}"], output_dir=str(out2)))
    assert torch.load(out2 / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 3
    assert os.path.isfile(out2 / run_dir.RUN_CONFIG)


def test_train_py_rerun_with_a_new_lr_is_refused_before_any_work(datasets_dir, tmp_path):
    """The real train.py: a finished run rerun with another train.lr would resume (and re-export
    the old head as the new config's): refused, naming the key, its checkpoints untouched."""
    from eagle3.stages.train import run as train

    out = tmp_path / "run"
    args = TINY + [f"paths.datasets_dir={datasets_dir}"]
    train(compose("train", args, output_dir=str(out)))
    last = out / "checkpoints" / "last.ckpt"
    before = (last.stat().st_mtime_ns, (out / "summary.json").read_bytes())
    with pytest.raises(run_dir.RunConfigChangedError, match=r"train\.lr: 0\.0003 -> 0\.001.*resume_anyway=true"):
        train(compose("train", [*args, "train.lr=1e-3"], output_dir=str(out)))
    assert (last.stat().st_mtime_ns, (out / "summary.json").read_bytes()) == before
