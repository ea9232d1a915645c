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
    assert "expected one of [fp8, compressed_tensors, awq, gptq, none]" in str(err.value.__cause__)


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


def test_none_is_the_checkpoint_as_it_is_on_every_route():
    """model.quantization=none means what null means (no engine flag, the HF routes accepted, the same
    dataset); evaluate.py's engine.quantization=none is how a head trained against a quantized target
    is measured against the unquantized one (its null takes the export's)."""
    from eagle3.target_model.quantization import engine_kwargs, serve_flags, vllm_name

    cfg = compose("extract", ["model.quantization=none"])
    validate_run_config(cfg)  # capture=hf: accepted, nothing is quantized
    assert vllm_name(cfg.model.quantization) is None and vllm_name("none") is None
    assert engine_kwargs(Quantization.none) == {} and serve_flags(Quantization.none) == ""
    from eagle3.stages.compose import register_evaluate_config

    register_evaluate_config()
    evaluate = compose("evaluate", ["export_dir=/x", "engine.quantization=none"])
    assert evaluate.engine.quantization == Quantization.none
