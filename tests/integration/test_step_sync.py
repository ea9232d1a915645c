"""The training step makes no tensor on the device from a host value: ``torch.tensor(x,
device=...)`` copies host to device and waits for it, once a step (issue 48). Real steps of the
tiny model through train.py's stage, with ``torch.tensor`` counted where the module calls it."""

from __future__ import annotations

import sys

import torch
from conftest import ROOT, compose

TINY = ["experiment=tiny_test"]
MODULE = str(ROOT / "eagle3" / "training" / "module.py")


def test_training_steps_make_no_device_tensor_from_a_host_value(datasets_dir, tmp_path, monkeypatch):
    from eagle3.stages.train import run as train
    from eagle3.training.module import Eagle3LitModule

    real_tensor, made_on_device, steps, in_step = torch.tensor, [], [], []

    def counted_tensor(*args, **kwargs):
        caller = sys._getframe(1).f_code
        if in_step and caller.co_filename == MODULE and kwargs.get("device") is not None:
            made_on_device.append((caller.co_name, args[:1]))
        return real_tensor(*args, **kwargs)

    real_step = Eagle3LitModule.training_step

    def counted_step(self, batch, batch_idx):
        steps.append(self.global_step)
        in_step.append(True)  # the step's path only: validation runs once per interval, not per step
        try:
            return real_step(self, batch, batch_idx)
        finally:
            in_step.clear()

    monkeypatch.setattr(torch, "tensor", counted_tensor)
    monkeypatch.setattr(Eagle3LitModule, "training_step", counted_step)
    train(
        compose("train", TINY + [f"paths.datasets_dir={datasets_dir}", "train.max_steps=4"], output_dir=str(tmp_path))
    )
    assert len(steps) == 4  # the steps ran, through the wrapped torch.tensor
    assert made_on_device == [], f"per-step tensors made on the device from host values: {made_on_device}"
