"""One wall-clock budget for the whole pipeline, run for real: extract.py then train.py
(subprocesses) end inside their minutes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from eagle3.store import Manifest


def test_the_pipeline_ends_inside_its_minutes(tmp_path):
    """extract.py then train.py under one 90-second budget (tiny target, real ShareGPT samples):
    the extraction records its seconds, training runs past the preset's step count until the
    clock, and summary.json says the two together stayed inside."""
    common = ["experiment=tiny_test", "time_budget.minutes=1.5", f"paths.datasets_dir={tmp_path / 'data'}"]
    subprocess.run([sys.executable, "extract.py", *common], cwd=ROOT, check=True, capture_output=True)
    (ds_dir,) = [p for p in (tmp_path / "data").iterdir() if p.is_dir()]
    extract_s = Manifest.read(ds_dir).provenance["extract_seconds"]
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
