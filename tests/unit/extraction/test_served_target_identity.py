"""A dataset's fingerprint tells the served target and the chat template's call apart: set,
model.quantization, data.chat_template_kwargs and data.system_prompt each name another dataset;
unset, the fingerprint inputs are those of before (no key). The manifest's provenance names a
checkpoint's own quantization_config, which no flag set."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from conftest import compose

from eagle3.config.choices import Quantization
from eagle3.config.schema import run_config
from eagle3.extraction.identity import (
    DatasetIdentity,
    dataset_path,
    fingerprint_inputs,
    legacy_fingerprint_inputs,
    provenance,
)
from eagle3.store import dataset_fingerprint


def _identity(tmp_path: Path, quant_method: str | None = None) -> DatasetIdentity:
    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    hf: dict = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64}
    if quant_method:
        hf["quantization_config"] = {"quant_method": quant_method}
    (model / "config.json").write_text(json.dumps(hf))
    (model / "model.safetensors").write_bytes(b"\1" * 128)
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n"
    )
    cfg = run_config(compose("extract", ["data=jsonl", f"data.path={chats}", "capture=vllm"]))
    return DatasetIdentity(
        model=cfg.model,
        target_dir=str(model),
        data=cfg.data,
        layer_ids=(1, 2, 4),
        capture_dtype="bfloat16",
        datasets_dir=str(tmp_path / "datasets"),
        cache_dir=str(tmp_path / "cache"),
    )


def _with(identity: DatasetIdentity, *, model: dict | None = None, data: dict | None = None) -> DatasetIdentity:
    return dataclasses.replace(
        identity,
        model=dataclasses.replace(identity.model, **(model or {})),
        data=dataclasses.replace(identity.data, **(data or {})),
    )


def test_the_quantization_names_another_dataset_only_when_set(tmp_path):
    plain = _identity(tmp_path)
    before = fingerprint_inputs(plain)
    assert "quantization" not in before  # unset: the inputs (and so the names) of before
    fp8 = _with(plain, model={"quantization": Quantization.fp8})
    assert fingerprint_inputs(fp8) == {**before, "quantization": "fp8"}
    assert dataset_path(fp8) != dataset_path(plain)
    assert fingerprint_inputs(_with(plain, model={"quantization": Quantization.none})) == before  # none is null
    # a dataset of the first scheme (all of the unquantized target) is never this one's
    assert dataset_fingerprint(legacy_fingerprint_inputs(fp8)) != dataset_fingerprint(legacy_fingerprint_inputs(plain))


def test_the_chat_templates_call_names_another_dataset_only_when_set(tmp_path):
    plain = _identity(tmp_path)
    before = fingerprint_inputs(plain)
    assert "chat_template_kwargs" not in before["data"] and "system_prompt" not in before["data"]
    thinking_off = _with(plain, data={"chat_template_kwargs": {"enable_thinking": False}})
    assert fingerprint_inputs(thinking_off)["data"] == {
        **before["data"],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    system = _with(plain, data={"system_prompt": "Be brief."})
    assert fingerprint_inputs(system)["data"] == {**before["data"], "system_prompt": "Be brief."}
    assert len({dataset_path(i) for i in (plain, thinking_off, system)}) == 3


def test_the_manifest_names_a_checkpoints_own_format(tmp_path):
    own = _identity(tmp_path, "compressed-tensors")
    assert provenance(own, None)["served_target"] == {
        "name": "compressed-tensors",
        "source": "checkpoint's own quantization_config",
    }
    assert "quantization" not in fingerprint_inputs(own)  # its weights' hash names that checkpoint already
    assert "served_target" not in provenance(_identity(tmp_path / "plain"), None)
