"""The GPU recipes, one per target class: each composes for both stages with a GPU topology, the
GPU sizes and vLLM capture; its model preset builds (at random, for a rehearsal on a machine
without the weights) to the published parameter count; and `--cfg job` shows it without running."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, compose
from omegaconf import OmegaConf

from eagle3.target_model.resolve import tiny_config
from eagle3.target_model.size import target_size

# recipe -> (topology, extraction TP, hidden layout, published total / active parameters in billions)
RECIPES = {
    "llama3_1_8b": ("gpu1", 1, "bfloat16 [T, 4, 4096]", 8.03, 8.03),
    "qwen3_8b": ("gpu1", 1, "bfloat16 [T, 4, 4096]", 8.19, 8.19),
    "qwen3_30b_a3b": ("gpu1", 1, "bfloat16 [T, 4, 2048]", 30.5, 3.3),
    "kimi_k2_5": ("gpu8_tp8", 8, "bfloat16 [T, 4, 7168]", 1026.0, 32.7),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_composes_for_its_class(recipe):
    topology, tp, layout, total_b, active_b = RECIPES[recipe]
    for entry in ("extract", "train"):
        cfg = compose(entry, [f"experiment={recipe}"])
        assert cfg.model.name == recipe and cfg.tags == [recipe]
        assert (cfg.topology.accelerator, cfg.topology.extract_tp) == ("gpu", tp)
        assert cfg.sizes == "gpu" and cfg.sizes_source == "topology.accelerator=gpu"
        assert cfg.capture.backend == "vllm" and cfg.capture.vllm_route == "native"
        assert cfg.capture.hidden_layout == layout
        assert cfg.data.regenerate and cfg.data.max_length == 2048 and cfg.head.draft_vocab_size == 32000
    # the preset's facts and extra_config are the real config.json's: a random build has its size
    hf = tiny_config(OmegaConf.to_object(compose("extract", [f"experiment={recipe}", "model.source=tiny"]).model))
    size = target_size(hf.to_dict())
    assert size.params / 1e9 == pytest.approx(total_b, rel=0.01)
    assert size.active_params / 1e9 == pytest.approx(active_b, rel=0.02)


def test_the_kimi_recipe_shows_its_estimates_by_cfg_job():
    out = subprocess.run(
        [sys.executable, "extract.py", "experiment=kimi_k2_5", "--cfg", "job", "--resolve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "extract_tp: 8" in out.stdout and "hidden_layout: bfloat16 [T, 4, 7168]" in out.stdout
    assert "disk_per_1m_tokens: 53.4 GiB" in out.stdout and "trust_remote_code: true" in out.stdout
