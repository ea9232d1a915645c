"""One wall-clock budget for the whole pipeline, run for real: extract.py then train.py
(subprocesses) end inside their minutes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, compose

from eagle3.config.schema import run_config
from eagle3.planning import time_budget
from eagle3.store import Manifest


def test_the_pipeline_ends_inside_its_minutes(tmp_path):
    """extract.py then train.py under one 90-second budget (tiny target, real ShareGPT samples):
    the extraction records its seconds, training runs past the preset's step count until the
    clock, and summary.json says the two together stayed inside. Both record what they measured on this
    machine, and the next plan with time_budget.rates=machine divides by it; summary.json says how many
    passes the fit made over its training tokens."""
    rates_file = tmp_path / "machine_rates.json"
    common = [
        "experiment=tiny_test",
        "time_budget.minutes=1.5",
        f"paths.datasets_dir={tmp_path / 'data'}",
        f"paths.machine_rates={rates_file}",
    ]
    subprocess.run([sys.executable, "extract.py", *common], cwd=ROOT, check=True, capture_output=True)
    (dataset_dir,) = [p for p in (tmp_path / "data").iterdir() if p.is_dir()]
    extract_s = Manifest.read(dataset_dir).provenance["extract_seconds"]
    assert 0 < extract_s < 90
    run = tmp_path / "run"
    proc = subprocess.run(
        # validations 100 steps apart: the ETA times 10 steps between two of them
        [sys.executable, "train.py", *common, f"hydra.run.dir={run}", "train.val_check_interval=100"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    summary = json.loads((run / "summary.json").read_text())
    outcome = summary["time_budget"]
    assert outcome["inside"] is True and outcome["total_s"] <= 90
    assert outcome["extract_s"] == pytest.approx(extract_s, abs=0.1)
    assert summary["global_step"] > 6  # tiny_test's train.max_steps: the clock ends this run
    assert Path(summary["export_dir"], "model.safetensors").is_file()
    out = proc.stderr + proc.stdout
    assert "training gets" in out and "(inside)" in out
    assert "train.max_time leaves" in out  # the ETA counts down the clock, not max_steps
    fit = summary["fit"]
    train_tokens = _train_tokens(dataset_dir)
    assert fit["train_tokens"] == train_tokens and fit["passes_planned"] == 2.0
    assert fit["passes"] == pytest.approx(fit["tokens"] / train_tokens, rel=0.01) and fit["passes"] > 1
    # summary.json rounds the passes to 2 places, the line prints 1: the same figure, not one string
    passes = re.search(rf"fit: ([0-9.]+) passes over {train_tokens:,} training tokens", out)
    assert passes is not None and float(passes.group(1)) == pytest.approx(fit["passes"], abs=0.051)
    # summary.json rounds the share to 4 places, the line prints it to 0.1%: the same figure, not one string
    printed = re.search(r"data wait ([0-9.]+)% of the steps' time", out)
    assert 0.0 <= fit["data_wait_frac"] < 1.0 and printed is not None
    assert float(printed.group(1)) == pytest.approx(100 * fit["data_wait_frac"], abs=0.051)
    # what twice the minutes would buy, from the validations this machine had time for, or why not
    more = summary["more_minutes"]
    if more is None:
        assert "more minutes: no estimate" in out
    else:
        # summary.json rounds the gain to 4 places, the line prints 3: the same figures, not one string
        line = re.search(r"-> ([0-9.]+) \(now ([0-9.]+): ([+-][0-9.]+)", out)
        assert more["steps"] <= summary["global_step"] and line is not None, out[-2000:]
        then, now, gain = (float(g) for g in line.groups())
        assert then == pytest.approx(more["then"], abs=5e-4) and now == pytest.approx(more["now"], abs=5e-4)
        assert gain == pytest.approx(more["gain"], abs=6e-4)
    recorded = json.loads(rates_file.read_text())["machines"]
    (figures,) = recorded.values()  # this machine, one entry
    assert {"capture_tok_s", "train_tok_s", "start_s"} <= set(figures)
    (train_tok_s,) = figures["train_tok_s"].values()
    assert train_tok_s == pytest.approx(fit["tok_s"], rel=0.01)
    cfg = run_config(compose("train", [*common, "train.val_check_interval=100", "time_budget.rates=machine"]))
    assert time_budget.budget_rates(cfg).train_tok_s == pytest.approx(train_tok_s)


def _train_tokens(dataset_dir: Path) -> int:
    from eagle3.store import open_dataset

    ds = open_dataset(dataset_dir)
    val = set(ds.val_indices())
    return sum(n for i, n in enumerate(ds.lengths.tolist()) if i not in val)


def test_training_finds_its_dataset_when_the_rates_since_put_the_fixed_costs_past_the_minutes(tmp_path):
    """The extraction records this machine's rates (an engine's start among them): where they now put
    the fixed costs alone past the minutes, a plan would refuse; but extract.py's plan ran already,
    so train.py trains on the dataset it wrote, on the clock as it finds it."""
    import eagle3.stages.extract as extract_stage
    import eagle3.stages.train as train_stage
    from eagle3.planning import machine_rates

    common = [
        "experiment=tiny_test",
        "time_budget.minutes=0.6",
        f"paths.datasets_dir={tmp_path / 'data'}",
        f"paths.machine_rates={tmp_path / 'machine_rates.json'}",
    ]
    cfg = run_config(compose("train", common))
    machine_rates.record(cfg, {"start_s": 1.0})  # quick starts: the 36 s plan holds (the table's CPU start would not)
    dataset_dir = Path(extract_stage.run(compose("extract", common)))
    machine_rates.record(cfg, {"start_s": 120.0})  # then two stage starts are 4 minutes of the 0.6
    with pytest.raises(time_budget.FixedCostsPastBudget, match="fixed costs alone"):
        time_budget.time_shares(cfg)
    run = tmp_path / "run"
    train_stage.run(compose("train", common, output_dir=str(run)))
    summary = json.loads((run / "summary.json").read_text())
    assert Path(summary["dataset_dir"]) == dataset_dir
    assert summary["time_budget"]["fit_s"] > 0 and summary["global_step"] > 0


def test_a_capture_of_a_handful_of_samples_records_no_rate(tmp_path):
    """A few samples measure their warm-up, not this machine's capture rate: a budget planned from
    such a figure would give capture minutes it never needs. From MIN_RATE_SAMPLES on, it is kept."""
    import eagle3.stages.extract as extract_stage
    from eagle3.extraction.write_dataset import MEASURED_RATES, MIN_RATE_SAMPLES

    def measured(samples: int) -> dict:
        overrides = [
            "experiment=tiny_test",
            f"data.max_samples={samples}",
            f"paths.datasets_dir={tmp_path / str(samples)}",
        ]
        dataset_dir = Path(extract_stage.run(compose("extract", overrides)))
        return Manifest.read(dataset_dir).provenance.get(MEASURED_RATES) or {}

    assert "capture_tok_s" not in measured(MIN_RATE_SAMPLES - 10)
    assert measured(MIN_RATE_SAMPLES + 8)["capture_tok_s"] > 0
