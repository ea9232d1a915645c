"""Step costs without the weights: lab/leased_gpu/shapes_only.py writes a recipe's target and
head as config files only, at the real shapes (no weight file, a few MiB), and vLLM serves them
with dummy weights through bench/serving_speedup.py --load-format dummy (the real CPU build, on a
tiny target's shapes): the spec-decode counters run, so the step costs of a class whose weights
never reach the machine are measurable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from eagle3.target_model.size import target_size

SCRIPT = ROOT / "lab" / "leased_gpu" / "shapes_only.py"


def shapes(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_moe_recipe_as_config_files_only(tmp_path, smollm2_dir):
    proc = shapes(tmp_path, "experiment=qwen3_30b_a3b", f"model.tokenizer_from={smollm2_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    target, head = tmp_path / "target", tmp_path / "head"
    assert not list(tmp_path.rglob("*.safetensors"))  # shapes only: nothing of 61 GB travels
    hf = json.loads((target / "config.json").read_text())
    assert hf["architectures"] == ["Qwen3MoeForCausalLM"] and hf["num_hidden_layers"] == 48
    size = target_size(hf)
    assert size.params / 1e9 == pytest.approx(30.5, rel=0.01)
    assert size.active_params / 1e9 == pytest.approx(3.3, rel=0.02)
    assert (target / "tokenizer.json").is_file()
    config = json.loads((head / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 24, 45]  # the recipe's, from N = 48
    assert config["draft_vocab_size"] == 32000 and config["transformer_layer_config"]["hidden_size"] == 2048
    assert "30.52B parameters, 3.34B active, 48 layers" in proc.stdout


def test_a_cut_is_an_override_and_a_missing_tokenizer_is_named(tmp_path):
    proc = shapes(tmp_path / "a", "experiment=kimi_k2_5", "model.extra_config.n_routed_experts=8")
    assert proc.returncode != 0 and "model.tokenizer_from=DIR" in proc.stderr
    proc = shapes(
        tmp_path / "b",
        "experiment=kimi_k2_5",
        "model.tokenizer_from=smollm2_135m",
        "model.extra_config.n_routed_experts=8",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf = json.loads((tmp_path / "b" / "target" / "config.json").read_text())
    # every routed expert active: Kimi-K2.5's active path (32.7B per token) in what one GPU holds
    assert hf["n_routed_experts"] == 8 and hf["num_hidden_layers"] == 61
    assert target_size(hf).params / 1e9 == pytest.approx(32.7, rel=0.02)
    # vLLM builds the router's e_score_correction_bias (which the weights hold) only for this
    # method: without it, loading stops on a KeyError for layers.1.mlp.gate.e_score_correction_bias
    assert hf["topk_method"] == "noaux_tc" and hf["scoring_func"] == "sigmoid"


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serves_shapes_only_with_dummy_weights(tmp_path):
    pytest.importorskip("vllm")
    # head_dim 64: the CPU build's attention has no kernel for tiny_llama's 16
    proc = shapes(tmp_path / "shapes", "model=tiny_llama", "model.hidden_size=256", "layers.aux_ids=[1,2,3]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
            for q in ("Name a colour.", "Add 2 and 3.")
        )
    )
    out = tmp_path / "costs.json"
    cmd = [
        sys.executable, str(ROOT / "bench" / "serving_speedup.py"),
        "--target", str(tmp_path / "shapes" / "target"), "--export-dir", str(tmp_path / "shapes" / "head"),
        "--load-format", "dummy", "--prompts-jsonl", str(chats), "--loads", "1", "--draft-tokens", "2",
        "--prompts", "2", "--max-new-tokens", "8", "--max-model-len", "512", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1")}
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    # without --load-format dummy the engine stops at once: neither directory holds a weight file
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    row = result["table"]["1"]["by_k"]["2"]
    assert row["acceptance_length"] >= 1.0  # the counters ran: drafts were proposed and verified
    assert result["step_costs"]["1"]["2"] > 0
