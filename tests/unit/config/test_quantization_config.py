"""model.quantization at compose: an unknown value fails naming the accepted ones; train.py's
evaluation engines follow it; the routes that run the target through transformers refuse it,
naming the vLLM route; Kimi-K2.5's preset names its checkpoint's real format."""

from __future__ import annotations

import pytest
from conftest import compose
from hydra.errors import ConfigCompositionException

from eagle3.config.choices import Quantization
from eagle3.config.errors import ConfigError
from eagle3.stages.validate import validate_run_config

VLLM = ["model.quantization=fp8", "capture=vllm"]


def test_an_unknown_value_names_the_accepted_ones():
    with pytest.raises(ConfigCompositionException) as err:
        compose("extract", ["model.quantization=int4"])
    assert "expected one of [fp8, compressed_tensors, awq, gptq]" in str(err.value.__cause__)


def test_train_evaluation_engines_follow_model_quantization():
    cfg = compose("train", VLLM)
    assert cfg.engine.quantization == "fp8"
    validate_run_config(cfg)  # capture=vllm: accepted
    assert compose("train").engine.quantization is None
    kimi = compose("extract", ["model=kimi_k2_5", "topology=gpu8_tp8", "capture=vllm"])
    assert kimi.model.quantization == Quantization.compressed_tensors  # the checkpoint's INT4 format


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (["model.quantization=fp8"], r"model.quantization=fp8 with capture=hf: .*Use capture=vllm"),
        (
            [*VLLM, "data.regenerate=true", "data.regen_backend=hf"],
            r"with data.regen_backend=hf: .*Use data.regen_backend=vllm",
        ),
        ([*VLLM, "train.hidden_states=online"], r"with train.hidden_states=online: .*capture=vllm"),
    ],
)
def test_the_transformers_routes_are_refused_at_validation(overrides, refusal):
    with pytest.raises(ConfigError, match=refusal):
        validate_run_config(compose("extract", overrides))
