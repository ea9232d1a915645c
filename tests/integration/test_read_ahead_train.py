"""train.py with train.read_ahead trains the same head as without it, on a real extracted
dataset."""

from __future__ import annotations

import json

import torch
from conftest import compose
from helpers.processes import read_ahead_threads
from safetensors.torch import load_file


def test_train_py_with_read_ahead_trains_the_same_head(tmp_path):
    """The real train.py on the tiny target: the head reading ahead equals, weight for weight,
    the head whose step thread read its own batches."""
    from eagle3.stages.extract import run as extract
    from eagle3.stages.train import run as train

    args = ["experiment=tiny_test", "eval.enabled=false", f"paths.datasets_dir={tmp_path / 'data'}"]
    extract(compose("extract", args))
    heads, losses = [], []
    for read_ahead in (0, 2):
        out = tmp_path / f"run{read_ahead}"
        train(compose("train", [*args, f"train.read_ahead={read_ahead}"], output_dir=str(out)))
        summary = json.loads((out / "summary.json").read_text())
        heads.append(load_file(str(out / "export" / "model.safetensors")))
        losses.append(summary["final"]["val/loss"])
    assert losses[0] == losses[1]
    assert set(heads[0]) == set(heads[1])
    for name in heads[0]:
        assert torch.equal(heads[0][name], heads[1][name]), name
    assert not read_ahead_threads()
