"""The acceptance evaluation's engines run the target the head was trained against: the request's
options carry model.quantization (train.py: conf/engine/default.yaml points engine.quantization
at it; evaluate.py: the export's eagle3_meta.json), and the engine process builds its LLM(...)
arguments from the request it reads back. No engine is started."""

from __future__ import annotations

import json

from eagle3.config.choices import Quantization
from eagle3.config.engine import EngineOptions
from eagle3.evaluation.engine import llm_kwargs
from eagle3.evaluation.engine_io import EngineRequest, PromptBatch
from eagle3.evaluation.export_info import read_export, served_engine


def _request(options: EngineOptions, head: str | None = "/exports/head") -> EngineRequest:
    return EngineRequest(
        model="/targets/t",
        head=head,
        num_draft_tokens=3,
        max_new_tokens=16,
        max_model_len=256,
        batches=[PromptBatch("broad", [[1, 2, 3]])],
        options=options,
        chat_template_kwargs={"enable_thinking": False},
    )


def test_both_engines_get_the_quantization_through_the_request_file():
    sent = _request(EngineOptions(quantization=Quantization.compressed_tensors))
    read = EngineRequest.from_json(sent.to_json())  # what the engine process reads
    with_head = llm_kwargs(read, on_cpu=True, per_request=True)
    alone = llm_kwargs(
        EngineRequest.from_json(_request(sent.options, head=None).to_json()), on_cpu=True, per_request=True
    )
    assert with_head["quantization"] == alone["quantization"] == "compressed-tensors"
    assert with_head["speculative_config"]["method"] == "eagle3" and "speculative_config" not in alone
    assert read.chat_template_kwargs == {"enable_thinking": False}  # second turns render as the first
    assert "quantization" not in llm_kwargs(_request(EngineOptions()), on_cpu=True, per_request=False)


def _export(tmp_path, meta: dict | None):
    d = tmp_path / "export"
    d.mkdir()
    config = {"speculators_model_type": "eagle3", "speculators_config": {"verifier": {"name_or_path": "org/t"}}}
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors").write_bytes(b"")
    if meta is not None:
        (d / "eagle3_meta.json").write_text(json.dumps(meta))
    return d


def test_evaluate_takes_the_exports_quantization_unless_engine_quantization_says(tmp_path):
    info = read_export(_export(tmp_path, {"serve_quantization": "fp8"}))
    assert info.quantization == "fp8"
    assert (
        llm_kwargs(_request(served_engine(EngineOptions(), info)), on_cpu=True, per_request=False)["quantization"]
        == "fp8"
    )
    explicit = served_engine(EngineOptions(quantization=Quantization.awq), info)
    assert explicit.quantization == Quantization.awq
    # none: the unquantized target, whatever the export was trained against
    plain = served_engine(EngineOptions(quantization=Quantization.none), info)
    assert "quantization" not in llm_kwargs(_request(plain), on_cpu=True, per_request=False)


def test_an_export_without_the_record_runs_the_target_as_it_is(tmp_path):
    info = read_export(_export(tmp_path, {"serve_tensor_parallel_size": 1}))  # written before the option
    assert info.quantization is None
    assert served_engine(EngineOptions(), info).quantization is None
