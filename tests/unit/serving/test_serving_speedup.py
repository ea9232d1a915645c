"""The serving measurement (eagle3/serving/speedup.py), run as the product command
`python evaluate.py export_dir=<dir> serving.measure=true ...` on the real vLLM (the CPU build)
with a random-init SmolLM2 head, on the held-out suite's opening turns: the natural-EOS runs (a
queue kept at c requests, answers ending at EOS) are the table and the advice; the step-cost
waves (ignore_eos) hold exactly c requests, none preempted, every request the same length, and
give the step costs; the head's acceptance is measured near 1.0 from vLLM's counters, and the
advice written into the export (serving.json, for these weights) is what the natural-EOS table says. The speed-ups themselves are CPU figures and say nothing about serving on a GPU; the
structure is what is checked. bench/serving_speedup.py is a CLI over the same functions."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from helpers import export_random_head

from eagle3.config.cli import ServingConfig
from eagle3.evaluation.engine_io import EngineRequest
from eagle3.serving import advice as sa
from eagle3.serving import speedup as ss


@pytest.mark.slow
@pytest.mark.vllm
def test_serving_speedup_on_the_cpu_build(tmp_path, smollm2_dir):
    pytest.importorskip("vllm")
    export = export_random_head(tmp_path / "export", smollm2_dir)
    out_dir = tmp_path / "out"
    out = out_dir / "serving_speedup.json"
    cmd = [
        sys.executable,
        str(ROOT / "evaluate.py"),
        f"export_dir={export}",
        f"target={smollm2_dir}",
        "serving.measure=true",
        "serving.loads=[1,2]",
        "serving.draft_tokens=[2]",
        "serving.prompts=3",
        "serving.max_new_tokens=12",
        f"paths.cache_dir={tmp_path / 'cache'}",  # finished engines: <cache>/serving/<the export's key>
        "engine.cpu_kvcache_space_gb=4",
        f"out_dir={out_dir}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert Path(proc.stdout.strip().splitlines()[-1]) == out  # the contract: last stdout line
    result = json.loads(out.read_text())
    assert result["prompts"] == {"broad": 3} and result["draft_tokens"] == [2]
    assert result["table_label"].startswith("natural EOS") and result["turns"].startswith("first turns only")
    assert result["step_cost_waves"]["label"] == "step-cost waves, ignore_eos"
    table = {int(k): v for k, v in result["table"].items()}
    waves = {int(k): v for k, v in result["step_cost_waves"]["table"].items()}
    assert set(table) == set(waves) == {1, 2}
    for load, row in waves.items():
        # every prompt at least once, two waves at least, whole waves of exactly `load`
        assert row["requests"] == max(3, 2 * load) + (-max(3, 2 * load)) % load
        assert row["target_alone_wave_sizes"] == [load] and row["target_alone_preemptions"] == 0
        v = row["by_k"]["2"]
        assert v["wave_sizes"] == [load] and v["preemptions"] == 0 and v["all_full_length"]
        assert 1.0 <= v["acceptance_length"] < 1.2 and len(v["per_position"]) == 2  # a random head
        # the step cost is tokens per verify step over the speed-up, from the waves
        assert result["step_costs"][str(load)]["2"] == pytest.approx(v["acceptance_length"] / v["speedup"], abs=1e-3)
    for load, row in table.items():  # natural EOS: the same requests, kept `load` in flight
        assert row["requests"] == waves[load]["requests"] and row["concurrency"] == load
        v = row["by_k"]["2"]
        assert v["preemptions"] == 0 and v["wave_sizes"] == [] and 1.0 <= v["acceptance_length"] < 1.2
        assert 0 < v["mean_output_tokens"] <= 12 and row["target_alone_mean_output_tokens"] <= 12
        assert v["speedup"] == pytest.approx(v["tok_s"] / row["target_alone_tok_s"])
        assert row["best_k"] == (2 if v["speedup"] >= sa.MIN_SPEEDUP["measured"] else 0)
    advice = sa.ServingAdvice.read(export)
    assert advice is not None and advice.source == "measured" and advice.head_sha256 == sa.head_sha256(export)
    assert {a.load: a.num_speculative_tokens for a in advice.loads} == {load: table[load]["best_k"] for load in table}
    assert "serving advice (measured by python evaluate.py serving.measure=true)" in proc.stdout

    # run again with the same --work-dir: no engine starts, the same table
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("result of an earlier run of the same request") == 2
    assert "vLLM engine" not in again.stderr
    assert json.loads(out.read_text())["table"] == result["table"]
    # the step costs from the work dir alone, as for a measurement cut off part-way
    work = tmp_path / "cache" / "serving"
    (work,) = work.iterdir()
    costs = ss.step_costs_in_work_dir(work)
    assert {str(load): {str(k): c for k, c in by_k.items()} for load, by_k in costs.items()} == result["step_costs"]
    # a time budget too short for one more engine: K=3 is not started (an engine here took as
    # long as the finished ones did), the table and the advice hold the K that ran, exit 0
    budget = [a for a in cmd if a != "serving.draft_tokens=[2]"] + [
        "serving.draft_tokens=[2,3]",
        "serving.max_minutes=0.05",
    ]
    short = subprocess.run(budget, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert short.returncode == 0, short.stdout[-3000:] + short.stderr[-3000:]
    assert "vLLM engine" not in short.stderr and "K=3: not started: " in short.stdout
    partial = json.loads(out.read_text())
    assert partial["draft_tokens"] == [2] and list(partial["not_measured"]) == ["3"]
    assert partial["table"] == result["table"]
    # a head retrained into the same directory is a different engine; the target alone is not
    assert work.name == hashlib.sha1(str(export.resolve()).encode()).hexdigest()[:12]
    assert not (export / "serving_work").exists()
    requests = {
        k: EngineRequest.from_json(json.dumps(json.loads((work / f"engine-k{k}.key.json").read_text())["request"]))
        for k in (0, 2)
    }
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b" ")
    assert ss.finished_engine(work, "k2", requests[2]) is None
    assert ss.finished_engine(work, "k0", requests[0]) is not None
    # a head vLLM cannot load: its engine fails, the target alone's is kept, and the error says both
    weights.write_bytes(b"not safetensors")
    broken = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert broken.returncode != 0
    assert "no engine with the head finished: K=2 failed: vLLM engine k2" in broken.stderr
    assert f"serving.work_dir={work}" in broken.stderr and ss.finished_engine(work, "k0", requests[0]) is not None


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
