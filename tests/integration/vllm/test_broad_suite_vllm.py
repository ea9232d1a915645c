"""The held-out suite through a real vLLM engine (SmolLM2, a random head): a second turn follows the
first's answer."""

from __future__ import annotations

import json

import pytest
from helpers import random_head_export, write_dataset_with_val_split

from eagle3.evaluation.suite import CATEGORIES

K = 3


@pytest.mark.slow
@pytest.mark.vllm
def test_the_suite_path_through_vllm_with_a_second_turn(tmp_path, smollm2_dir):
    """evaluate() with a random head on SmolLM2: nine suite prompts (one per category, then
    writing-02, whose second turn is asked after the engine's own answer), one math word problem,
    one validation prompt. Every figure per category, the interval from vLLM's per-request
    figures, the validation split beside the headline."""
    pytest.importorskip("vllm")
    from eagle3.config.schema import EvalConfig
    from eagle3.evaluation.acceptance import evaluate

    export = random_head_export(tmp_path / "export", smollm2_dir)
    ds = write_dataset_with_val_split(tmp_path / "ds", ["c1"])
    cfg = EvalConfig(num_draft_tokens=K, suite_prompts=9, math_prompts=1, max_prompts=1, humaneval_prompts=0,
                     max_new_tokens=24)  # fmt: skip
    result = evaluate(export, eval_cfg=cfg, dataset_dir=ds, target=str(smollm2_dir), baseline=False,
                      engine={"max_num_seqs": 16, "cpu_kvcache_space_gb": 2}, show_table=False)  # fmt: skip
    data = json.loads(result.json_path.read_text())
    assert data["prompts"] == {"broad": 9, "math_word": 1, "humaneval": 0, "val": 1}
    assert (
        data["headline"]["sets"] == ["broad", "math_word"] and data["headline"]["prompts"] == 11
    )  # 10 + a second turn
    assert set(data["by_category"]) == {*CATEGORIES, "math_word", "val"}
    assert data["by_category"]["writing"]["prompts"] == 2 and data["by_category"]["writing"]["interval"] is not None
    turns = {p["id"]: p for p in data["per_prompt"]}
    second, first = turns["writing-02#2"], turns["writing-02"]
    assert second["turn"] == 2 and second["category"] == "writing" and second["output_tokens"] > 0
    assert {p["finish_reason"] for p in data["per_prompt"]} <= {"stop", "length"}
    assert 0.0 <= data["ended_at_eos"] <= 1.0
    # the second turn holds the first, the engine's answer to it, and the new question
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["output_tokens"]
    assert sum(p["drafts"] for p in data["per_prompt"] if p["source"] != "val") == data["drafts"]
    assert data["interval"]["prompts"] >= 8 and data["interval"]["mean_acceptance_length"][0] >= 1.0
    assert data["in_distribution"]["label"] == "validation split (in-distribution)"
    assert data["in_distribution"]["prompts"] == 1 and data["consistency_problems"] == []
