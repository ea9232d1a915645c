"""model.quantization reaches the target's vLLM engines (regeneration, capture) as one argument,
built by eagle3/target_model/quantization.py; a checkpoint's own quantization_config is found
and a flag vLLM would refuse for it is refused before any engine starts; the routes that run the
target through transformers refuse it. No engine is started: the engines' arguments are built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3.config.choices import Quantization
from eagle3.config.dataset import CaptureConfig
from eagle3.config.target import TopologyConfig
from eagle3.target_model.backend import make_backend
from eagle3.target_model.capture_vllm import CaptureEngine, capture_llm_kwargs
from eagle3.target_model.generate.common import AnswerSettings
from eagle3.target_model.generate.hf_engine import HFRegenerator
from eagle3.target_model.generate.vllm_engine import VLLMRegenerator
from eagle3.target_model.quantization import (
    QuantizationError,
    checkpoint_quantization,
    engine_kwargs,
    serve_flags,
    served_quantization,
)


def _checkpoint(root: Path, quant_method: str | None = None, *, nested: bool = False) -> Path:
    """A model directory whose config.json carries ``quant_method`` (at the top, or in its
    text_config as a multimodal wrapper has it), with a small weight file."""
    root.mkdir(parents=True, exist_ok=True)
    text: dict = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64}
    cfg: dict = {"text_config": text} if nested else dict(text)
    if quant_method:
        (text if nested else cfg)["quantization_config"] = {"quant_method": quant_method, "bits": 4}
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "model.safetensors").write_bytes(b"\0" * 64)
    return root


def test_the_engine_argument_and_the_serve_flag_are_vllms_names():
    assert engine_kwargs(Quantization.compressed_tensors) == {"quantization": "compressed-tensors"}
    assert engine_kwargs("compressed_tensors") == {"quantization": "compressed-tensors"}  # the config's name
    assert engine_kwargs("fp8") == {"quantization": "fp8"}  # vLLM's name, as an engine request carries it
    assert engine_kwargs(None) == {}  # unset: vLLM runs the checkpoint as it is
    assert serve_flags(Quantization.awq) == " --quantization awq" and serve_flags(None) == ""
    with pytest.raises(
        QuantizationError, match=r"expected one of \['fp8', 'compressed_tensors', 'awq', 'gptq', 'none'\]"
    ):
        engine_kwargs("int4")


def test_a_checkpoints_own_format_is_found_and_a_conflicting_flag_refused(tmp_path):
    plain = _checkpoint(tmp_path / "plain")
    ct = _checkpoint(tmp_path / "ct", "compressed-tensors", nested=True)
    assert checkpoint_quantization(plain) is None and checkpoint_quantization(ct) == "compressed-tensors"

    found = served_quantization(None, ct)  # no flag: recorded all the same
    assert (found.name, found.source) == ("compressed-tensors", "checkpoint's own quantization_config")
    assert served_quantization(Quantization.compressed_tensors, ct).name == "compressed-tensors"
    online = served_quantization(Quantization.fp8, plain)
    assert (online.name, online.source) == ("fp8", "model.quantization")
    assert served_quantization(None, plain).name is None

    with pytest.raises(QuantizationError, match=r"model.quantization=fp8: expected null or 'compressed-tensors'"):
        served_quantization(Quantization.fp8, ct)
    with pytest.raises(QuantizationError, match=r"model.quantization=awq: .*carries no quantization_config"):
        served_quantization(Quantization.awq, plain)


def test_regeneration_and_capture_engines_get_the_quantization(tmp_path):
    model = _checkpoint(tmp_path / "model")
    regen = VLLMRegenerator(str(model), tmp_path / "cache", answers=AnswerSettings(quantization=Quantization.fp8))
    assert regen.llm_kwargs(on_gpu=False)["quantization"] == "fp8"
    plain = VLLMRegenerator(str(model), tmp_path / "cache")
    assert "quantization" not in plain.llm_kwargs(on_gpu=False)
    # the answers of the FP8 target are cached apart from the bf16 target's; unset, the key of before
    assert regen.cache_file != plain.cache_file

    def capture(quantization):
        return capture_llm_kwargs(
            str(model),
            "bfloat16",
            {"speculative_config": {"method": "extract_hidden_states"}},
            CaptureEngine(max_num_seqs=4, max_model_len=256, enforce_eager=True, quantization=quantization),
        )

    assert capture(Quantization.compressed_tensors)["quantization"] == "compressed-tensors"
    assert "quantization" not in capture(None)
    assert capture(None)["speculative_config"] == {"method": "extract_hidden_states"}


def test_the_transformers_routes_refuse_a_quantization_naming_the_vllm_one(tmp_path):
    model = _checkpoint(tmp_path / "model")
    with pytest.raises(ValueError, match=r"model.quantization=fp8 with capture=hf: .*Use capture=vllm"):
        make_backend(
            CaptureConfig(),
            TopologyConfig(),
            str(model),
            [1, 2, 4],
            torch.bfloat16,
            64,
            quantization=Quantization.fp8,
        )
    with pytest.raises(ValueError, match=r"with data.regen_backend=hf: .*Use data.regen_backend=vllm"):
        HFRegenerator(str(model), tmp_path / "cache", answers=AnswerSettings(quantization=Quantization.fp8))
