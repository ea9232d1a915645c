"""One polish round end to end on SmolLM2 with the CPU vLLM: a head with a random draft lm_head
(tests/helpers.py) is warm-started, SmolLM2 writes and answers new prompts in vLLM, the states are
captured, the head trains on the on-policy objective, and vLLM measures the start head against the
polished one on the same prompts into summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose
from helpers import random_head_export

from eagle3.stages.compose import register_polish_config
from eagle3.stages.polish import run as polish


@pytest.mark.vllm
def test_one_round_polishes_a_head_and_vllm_measures_both(smollm2_dir, tmp_path, capsys):
    pytest.importorskip("vllm")
    start = random_head_export(tmp_path / "start", smollm2_dir)
    register_polish_config()
    cfg = compose(
        "polish",
        [
            "experiment=smollm2_polish",
            f"paths.datasets_dir={tmp_path / 'data'}",
            f"train.init_from={start}",
            "data.mixture=[{name: self, source: self_prompts, weight: 1.0, prompt_max_tokens: 24}]",
            "data.regen_backend=vllm",
            "data.regen_max_tokens=32",
            "data.max_length=192",
            "data.val_fraction=0.25",
            "polish.rounds=1",
            "polish.prompts_per_round=8",
            "polish.steps_per_round=4",
            "polish.eval_rounds=false",
            "train.lr=2e-3",
            "train.warmup_steps=0",
            "train.val_check_interval=4",
            "eval.suite_prompts=2",
            "eval.math_prompts=0",
            "eval.max_prompts=2",
            "eval.humaneval_prompts=0",
            "eval.max_new_tokens=16",
            "logger=none",
        ],
        output_dir=str(tmp_path / "polish"),
    )
    figure = polish(cfg)
    summary = json.loads((tmp_path / "polish" / "summary.json").read_text())
    [record] = summary["rounds"]
    assert record["steps"] == 4 and record["tokens"] > 0
    assert Path(record["export_dir"]) == Path(summary["polished_export"])
    assert (Path(summary["polished_export"]) / "model.safetensors").is_file()
    start_acc, polished_acc = summary["acceptance"]["start"], summary["acceptance"]["polished"]
    # vLLM measured both heads (its counters: at least 1, at most 1 + K), on the same prompts
    for measured in (start_acc, polished_acc):
        assert 1.0 <= measured["mean_acceptance_length"] <= 4.0
        assert len(measured["per_position_acceptance_rate"]) == 3
    assert figure == pytest.approx(polished_acc["mean_acceptance_length"])
    prompts = {json.loads(Path(m["json"]).read_text())["dataset_dir"] for m in (start_acc, polished_acc)}
    assert prompts == {record["dataset_dir"]}
    out = capsys.readouterr().out
    assert "polish round 1/1:" in out and "polish: acceptance length in vLLM" in out
