"""The printed `vllm serve` line and the model card say what the target runs in; the serving
measurement's engines get model.quantization through their requests, and the requests of engines
run before the option keep their reuse keys."""

from __future__ import annotations

import json

from eagle3.config.choices import Quantization
from eagle3.config.cli import ServingConfig
from eagle3.config.engine import EngineOptions
from eagle3.evaluation.engine import llm_kwargs
from eagle3.serving import serve_command as sc
from eagle3.serving.model_card import NOT_RECORDED, served_target_line
from eagle3.serving.speedup import engine_key, engine_request


def test_the_serve_line_carries_the_quantization(tmp_path):
    line = sc.serve_command("/exports/head", "org/t", 3, 8, True, "compressed-tensors")
    assert line.startswith(
        "vllm serve org/t --tensor-parallel-size 8 --trust-remote-code --quantization compressed-tensors "
    )
    assert "--quantization" not in sc.serve_command("/exports/head", "org/t", 3)
    export = tmp_path / "export"
    export.mkdir()
    config = {
        "speculators_config": {"verifier": {"name_or_path": "org/t"}, "proposal_methods": [{"speculative_tokens": 3}]}
    }
    (export / "config.json").write_text(json.dumps(config))
    (export / "eagle3_meta.json").write_text(json.dumps({"serve_quantization": "fp8"}))
    first, _ = sc.export_serving_lines(export)
    assert first.startswith("serve it: vllm serve org/t --quantization fp8 --speculative-config")


def test_the_card_says_what_the_target_runs_in():
    online = {"served_target": {"name": "fp8", "source": "model.quantization"}}
    assert served_target_line(online) == "fp8 (applied by vLLM as it loads the weights)"
    own = {"served_target": {"name": "compressed-tensors", "source": "checkpoint's own quantization_config"}}
    assert served_target_line(own) == "compressed-tensors (checkpoint's own quantization_config)"
    assert served_target_line({"served_target": {"name": None, "source": None}}).startswith("unquantized")
    assert served_target_line({}) == NOT_RECORDED  # an export written before the record


def test_the_serving_measurements_engines_get_it_and_old_keys_stay():
    serving = ServingConfig()
    quantized = engine_request("/t", "/h", 3, [[1, 2]], {1: [0]}, serving, EngineOptions(quantization=Quantization.fp8))
    assert llm_kwargs(quantized, on_cpu=True, per_request=False)["quantization"] == "fp8"
    assert engine_key(quantized)["request"]["options"]["quantization"] == "fp8"
    plain = engine_request("/t", None, 0, [[1, 2]], {1: [0]}, serving, EngineOptions())
    key = engine_key(plain)["request"]
    assert "quantization" not in key["options"] and "chat_template_kwargs" not in key  # as written before the options
