"""selection.*: extract.py writes the selection set (conversations of another source, answered by
the target) as a dataset of its own beside the training data, and train.py validates on it and
picks the exported checkpoint by it (tiny random Llama, transformers' generate answers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose

from eagle3.config.schema import run_config
from eagle3.extraction.identity import DatasetNotFound
from eagle3.stages.extract import run as extract
from eagle3.stages.selection import find_selection
from eagle3.stages.train import run as train
from eagle3.store import Manifest
from eagle3.target_model.resolve import resolve_target


def _chats(path: Path, n: int, word: str) -> Path:
    rows = [
        {"id": f"{i}", "messages": [{"role": "user", "content": f"{word} {i}?"}, {"role": "assistant", "content": "-"}]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("selection")
    base = ["experiment=tiny_test", f"paths.datasets_dir={tmp / 'data'}", f"paths.cache_dir={tmp / 'cache'}"]
    picked = [
        "selection.samples=6",
        "selection.source=jsonl",
        f"selection.path={_chats(tmp / 'other.jsonl', 10, 'gamma')}",
        "data.regen_backend=hf",
        "data.regen_max_tokens=6",
    ]
    return tmp, base, picked


def test_extract_writes_the_selection_set_apart_and_the_training_data_keeps_its_name(runs, capsys):
    tmp, base, picked = runs
    dataset_dir = extract(compose("extract", [*base, *picked]))
    assert capsys.readouterr().out.strip().splitlines()[-1] == dataset_dir  # the training data's, last
    cfg = run_config(compose("extract", [*base, *picked]))
    sel_dir = find_selection(cfg, resolve_target(cfg.model, cfg.paths.cache_dir))
    assert sel_dir is not None and sel_dir != Path(dataset_dir)
    # the training data is the dataset the same run without a selection set names
    assert extract(compose("extract", base)) == dataset_dir
    sel = Manifest.read(sel_dir)
    assert sel.num_samples == 6 and not sel.val_ids  # every one for selection, none trained on
    assert all(i.startswith("select/") for i in sel.sample_ids)
    assert sel.num_loss_tokens >= 6  # the target answered each one
    train_ids = set(Manifest.read(Path(dataset_dir)).sample_ids)
    assert not train_ids & set(sel.sample_ids)


def test_train_validates_on_both_sets_and_picks_the_export_on_the_selection_set(runs):
    tmp, base, picked = runs
    out = tmp / "run"
    train(compose("train", [*base, *picked, "callbacks.model_checkpoint.save_top_k=2"], output_dir=str(out)))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_metric"] == "select/replay_accept_len"
    final, initial = summary["final"], summary["initial"]
    for prefix in ("val", "select"):
        assert f"{prefix}/replay_accept_len" in final and f"{prefix}/replay_accept_len" in initial
    cfg = run_config(compose("train", [*base, *picked]))
    sel = Manifest.read(find_selection(cfg, resolve_target(cfg.model, cfg.paths.cache_dir)))
    # every selection sample counted once (the answers' tokens that have a next token in the sample)
    assert 0 < final["select/tokens"] <= sel.num_loss_tokens
    assert final["select/tokens"] != final["val/tokens"]
    assert summary["best_metric_value"] == pytest.approx(
        max(final["select/replay_accept_len"], summary["best_metric_value"])
    )


def test_a_missing_selection_set_names_the_command_that_writes_it(runs):
    tmp, base, picked = runs
    other = [*base, *[p.replace("selection.samples=6", "selection.samples=5") for p in picked]]
    with pytest.raises(
        DatasetNotFound, match=r"selection.samples=5: the selection set's dataset is not there.*extract.py"
    ):
        train(compose("train", other, output_dir=str(tmp / "run-missing")))
