"""capture.storage through real runs: the fingerprint of an fp8 dataset extracted beside an exact
one, both training, and a real SmolLM2 capture in fp8 within tolerance of bf16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import compose
from helpers.storage import DT, FP8_ROW_BOUND, INPUTS, fp8_row_errors

from eagle3.store import (
    HiddenStateDataset,
    ShardWriter,
)
from eagle3.store.storage_format import StorageFormat

TINY = ["experiment=tiny_test"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    from eagle3.stages.extract import run as extract

    d = tmp_path_factory.mktemp("data")
    for storage in ("exact", "fp8"):
        extract(compose("extract", TINY + [f"paths.datasets_dir={d}", f"capture.storage={storage}"]))
    return d


def _recipe(datasets_dir: Path, storage: str):
    from eagle3.config.schema import run_config
    from eagle3.stages.narrow import dataset_identity
    from eagle3.target_model.resolve import resolve_target

    run = run_config(compose("extract", TINY + [f"paths.datasets_dir={datasets_dir}", f"capture.storage={storage}"]))
    return dataset_identity(run, resolve_target(run.model, run.paths.cache_dir))


def test_the_fingerprint_carries_a_format_other_than_exact(tiny_data):
    from eagle3.extraction.identity import dataset_path, fingerprint_inputs, token_fingerprint_inputs

    exact, fp8 = _recipe(tiny_data, "exact"), _recipe(tiny_data, "fp8")
    assert "storage" not in fingerprint_inputs(exact)  # datasets named before the field keep their names
    assert fingerprint_inputs(fp8)["storage"] == "fp8"
    assert dataset_path(exact) != dataset_path(fp8)
    assert token_fingerprint_inputs(exact) == token_fingerprint_inputs(fp8)  # online stores no states
    for identity, storage in ((exact, "exact"), (fp8, "fp8")):
        m = json.loads((dataset_path(identity) / "manifest.json").read_text())
        assert m["storage"] == storage and m["complete"]


def test_fp8_and_an_old_exact_dataset_both_train(tiny_data, tmp_path):
    from eagle3.extraction.identity import dataset_path
    from eagle3.stages.train import run as train

    old = dataset_path(_recipe(tiny_data, "exact")) / "manifest.json"
    raw = json.loads(old.read_text())
    raw.pop("storage")  # a dataset written before the field existed
    old.write_text(json.dumps(raw, indent=1))
    for storage in ("exact", "fp8"):
        out = tmp_path / storage
        train(
            compose(
                "train", TINY + [f"paths.datasets_dir={tiny_data}", f"capture.storage={storage}"], output_dir=str(out)
            )
        )
        summary = json.loads((out / "summary.json").read_text())
        assert summary["global_step"] == 6 and Path(summary["dataset_dir"]) == dataset_path(_recipe(tiny_data, storage))
        assert torch.isfinite(torch.tensor(summary["final"]["train/loss_k0"]))


@pytest.mark.slow
def test_a_real_smollm2_capture_in_fp8_is_within_tolerance_of_bf16(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    from eagle3.target_model.capture_hf import HFCaptureBackend

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    chats = ["What is 2+2? Four, as any calculator says.", "Name a colour: blue, like the sky at noon."]
    samples = []
    for i, text in enumerate(chats):
        ids = torch.tensor(tok(text)["input_ids"], dtype=torch.int64)
        samples.append((f"c{i}", ids, torch.ones(len(ids), dtype=torch.bool)))
    backend = HFCaptureBackend(str(smollm2_dir), [2, 15, 27, 30])
    try:
        captured = list(backend.capture(samples))
    finally:
        backend.close()
    kw = dict(layer_ids=(2, 15, 27, 30), hidden_size=576, dtype=DT, fingerprint_inputs=INPUTS)
    for storage in ("exact", "fp8"):
        w = ShardWriter(tmp_path / storage, storage=StorageFormat(storage), **kw)
        for (sid, _, _), s in zip(samples, captured):
            w.add(sid, s)
        w.finish(torch.zeros(49152, dtype=torch.int64), {})
    exact, fp8 = HiddenStateDataset(tmp_path / "exact"), HiddenStateDataset(tmp_path / "fp8")
    for i in range(len(exact)):
        want, got = exact[i]["hidden"], fp8[i]["hidden"]
        assert torch.equal(got[:, -1], want[:, -1])
        assert float(fp8_row_errors(got, want).max()) <= FP8_ROW_BOUND
        rel = (got[:, :-1].float() - want[:, :-1].float()).norm() / want[:, :-1].float().norm()
        assert 0 < float(rel) < 0.03  # e4m3's mean error on real states: ~2% of the norm
    sizes = [sum(p.stat().st_size for p in (tmp_path / s).glob("shard-*")) for s in ("exact", "fp8")]
    assert sizes[1] < 0.7 * sizes[0]
