"""The serving measurement's parts (eagle3/serving/speedup.py) without an engine: the engine's key,
the bench as a CLI over the measurement that leaves the export alone, every load warmed before
it is timed, step costs from a work dir of another measurement refused. Run for real:
integration/vllm/test_serving_speedup_vllm.py."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT

from eagle3.config.cli import ServingConfig
from eagle3.evaluation.engine_io import EngineRequest
from eagle3.serving import speedup as ss


def test_the_engine_key_is_the_request_but_how_long_the_caller_waits():
    """A rerun with another engine.timeout_s reuses a finished engine; other options make another engine."""
    import dataclasses

    from eagle3.config.engine import EngineOptions
    from eagle3.evaluation.engine_io import PromptBatch

    request = EngineRequest("m", None, 0, 8, 64, [PromptBatch("load-1", [[1]], 1, True)], EngineOptions(timeout_s=60))
    longer = dataclasses.replace(request, options=dataclasses.replace(request.options, timeout_s=600))
    wider = dataclasses.replace(request, options=dataclasses.replace(request.options, max_num_seqs=2))
    assert ss.engine_key(longer) == ss.engine_key(request) != ss.engine_key(wider)
    key = ss.engine_key(request)["request"]
    assert EngineRequest.from_json(json.dumps(key)).options.max_num_seqs == request.options.max_num_seqs


def test_the_bench_is_a_cli_over_the_measurement_that_leaves_the_export(monkeypatch, tmp_path):
    """bench/serving_speedup.py hands its arguments to measure_serving with write_advice off:
    serving.json is written by the product command only."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("serving_speedup_bench", ROOT / "bench" / "serving_speedup.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []
    monkeypatch.setattr(bench, "measure_serving", lambda *a: calls.append(a))
    out = str(tmp_path / "r.json")
    argv = ["serving_speedup.py", "--export-dir=E", "--target=T", "--loads=1,2", "--draft-tokens=2", f"--out={out}"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    ((export, target, dataset, check, engine, written),) = calls
    assert (export, target, dataset, written) == ("E", "T", None, out)
    assert check.loads == [1, 2] and check.draft_tokens == [2] and not check.write_advice
    assert engine.cpu_kvcache_space_gb == 4 and engine.timeout_s == 1800
    monkeypatch.setattr(sys, "argv", [*argv, "--write-advice"])
    with pytest.raises(SystemExit):
        bench.main()


def test_the_bench_warms_every_load_before_timing_it():
    """vLLM compiles some kernels (Triton's fused MoE) at the first batch of a new size: every wave
    size gets one warm-up call before any wave is timed, the largest first (it sizes the engine)."""
    from eagle3.config.engine import EngineOptions
    from eagle3.evaluation.engine_io import PromptBatch

    prompts = [[1, 2], [3], [4, 5, 6]]
    load_prompts = {c: ss.wave_requests(len(prompts), c, 2) for c in (1, 8, 32)}
    request = ss.engine_request("m", "h", 3, prompts, load_prompts, ServingConfig(), EngineOptions())
    assert request.warmup_sizes() == [32, 1, 8]
    # an evaluation request (no waves) warms up once, at its warm-up size
    plain = EngineRequest("m", "h", 3, 16, 256, [PromptBatch("val", [[1, 2], [3]])], EngineOptions(), 1)
    assert plain.warmup_sizes() == [1]


def test_step_costs_from_a_work_dir_refuse_engines_of_another_measurement(tmp_path):
    """--costs-from: engines whose requests differ from the target alone's (another length, other
    prompts) are not compared with it; without the target alone there is nothing to compare."""
    from eagle3.config.engine import EngineOptions
    from eagle3.evaluation.engine_io import BatchResult, EngineResult, PromptBatch

    def engine(k: int, max_new_tokens: int, seconds: float, accepted: int) -> None:
        request = EngineRequest(
            "m", "h" if k else None, k, max_new_tokens, 64, [PromptBatch("load-1", [[1]], 1, True)], EngineOptions()
        )
        counters = {"drafts": 4, "draft_tokens": 4 * k, "accepted_tokens": accepted} if k else None
        batch = BatchResult("load-1", [[7] * 8], seconds, counters, wave_sizes=[1], preemptions=0)
        (tmp_path / f"engine-k{k}.key.json").write_text(json.dumps(ss.engine_key(request)))
        (tmp_path / f"engine-k{k}.result.json").write_text(
            EngineResult("0.26.0", "cuda", False, 1, 1, [batch]).to_json()
        )

    with pytest.raises(ValueError, match="no finished engine-k0"):
        ss.step_costs_in_work_dir(tmp_path)
    engine(0, 8, 1.0, 0)
    engine(2, 8, 0.8, 2)  # 1.25x at 1.5 tokens per verify step: c = 1.5 / 1.25
    assert ss.step_costs_in_work_dir(tmp_path) == {1: {2: 1.2}}
    engine(3, 16, 0.8, 2)
    with pytest.raises(ValueError, match=r"engine-k3.key.json: max_new_tokens: expected the target alone's"):
        ss.step_costs_in_work_dir(tmp_path)
