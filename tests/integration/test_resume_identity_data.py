"""A rerun after the data changed (the chat file re-extracted with other answers) is refused naming
both datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose
from helpers import write_numbered_chats

from eagle3.training import run_dir

TINY = ["experiment=tiny_test", "eval.enabled=false"]


@pytest.fixture(scope="module")
def datasets_dir(tmp_path_factory) -> Path:
    from eagle3.stages.extract import run as extract

    d = tmp_path_factory.mktemp("data")
    chats = write_numbered_chats(d / "chats.jsonl", n=16)
    extract(compose("extract", TINY + ["data=jsonl", f"data.path={chats}", f"paths.datasets_dir={d}"]))
    return d


def test_a_rerun_after_the_data_changed_is_refused_naming_both_datasets(datasets_dir, tmp_path):
    """The real train.py: a finished run, the chat file edited and extracted again, the same
    command rerun: it used to resume, train 0 steps and re-export the old head as the new data's."""
    from eagle3.stages.extract import run as extract
    from eagle3.stages.train import run as train

    chats = datasets_dir / "chats.jsonl"
    args = TINY + ["data=jsonl", f"data.path={chats}", f"paths.datasets_dir={datasets_dir}"]
    out = tmp_path / "run"
    train(compose("train", args, output_dir=str(out)))
    old = json.loads((out / "summary.json").read_text())["dataset_dir"]
    last = out / "checkpoints" / "last.ckpt"
    before = (last.stat().st_mtime_ns, (out / "summary.json").read_bytes())
    write_numbered_chats(chats, n=16, answer="another answer")
    extract(compose("extract", args))
    with pytest.raises(run_dir.RunConfigChangedError) as e:
        train(compose("train", args, output_dir=str(out)))
    msg = str(e.value)
    assert f"{out / 'dataset_manifest.json'}: fingerprint: expected " in msg and old in msg
    assert "hydra.run.dir=<new dir>" in msg and "resume_anyway=true" in msg
    new = [p for p in datasets_dir.iterdir() if p.is_dir() and str(p) != old and p.name.startswith("tiny_llama-jsonl-")]
    assert len(new) == 1 and str(new[0]) in msg
    assert (last.stat().st_mtime_ns, (out / "summary.json").read_bytes()) == before
    # a new run dir trains on the new dataset
    train(compose("train", args, output_dir=str(tmp_path / "new_run")))
    assert json.loads((tmp_path / "new_run" / "summary.json").read_text())["dataset_dir"] == str(new[0])
