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
from helpers import random_head_export

from eagle3.evaluation.engine_io import EngineRequest
from eagle3.serving import advice as sa
from eagle3.serving import speedup as ss


@pytest.mark.slow
@pytest.mark.vllm
def test_serving_speedup_on_the_cpu_build(tmp_path, smollm2_dir):
    pytest.importorskip("vllm")
    export = random_head_export(tmp_path / "export", smollm2_dir)
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
