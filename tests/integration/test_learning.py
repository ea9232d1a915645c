"""Learning actually happens on the real target: SmolLM2-135M, real ShareGPT answers."""

from __future__ import annotations

import json

import pytest
from conftest import compose

from eagle3.stages.extract import run as extract
from eagle3.stages.train import run as train

SMALL = [
    "data.max_samples=64",
    "data.max_length=256",
    "data.val_fraction=0.15",
    "head.draft_vocab_size=4096",
    "train.ttt_steps=2",
    "train.max_steps=40",
    "train.warmup_steps=5",
    "train.lr=2e-3",
    "train.max_tokens_per_batch=1024",
    "train.val_check_interval=20",
    "logger=none",
    "eval.enabled=false",
]


@pytest.mark.slow
def test_short_cpu_run_on_smollm2_learns(tmp_path):
    data = [f"paths.datasets_dir={tmp_path / 'data'}"]
    extract(compose("extract", SMALL + data))
    train(compose("train", SMALL + data, output_dir=str(tmp_path / "run")))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    first, last = summary["initial"], summary["final"]
    print("initial", {k: round(v, 4) for k, v in first.items()})
    print("final  ", {k: round(v, 4) for k, v in last.items() if k.startswith("val/")})
    assert last["val/loss_k0"] < 0.8 * first["val/loss_k0"]
    assert last["val/acc_k0"] > first["val/acc_k0"] + 0.10
    assert last["val/sim_accept_len"] > first["val/sim_accept_len"]
    # the round-structured replay (K = min(eval.num_draft_tokens, ttt_steps) = 2) moves with it
    assert first["val/replay_accept_len"] < 1.05 < last["val/replay_accept_len"] <= 3.0
    assert last["val/replay_rounds"] > 0 and "val/sim_accept_len_k2" in last
