"""A resume compares what changes the result, and nothing else (issue 48): another dataset (the
chat file changed, so extract.py wrote a dataset of another fingerprint) is refused naming both;
the loader's processes, Lightning's sanity check, the run's length and another spelling of the
same data file resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import compose
from helpers import write_numbered_chats

from eagle3.config.schema import run_config
from eagle3.training import run_dir

TINY = ["experiment=tiny_test", "eval.enabled=false"]


def _cfg(tmp_path: Path, extra: list[str] = ()):
    return run_config(
        compose("train", TINY + [f"paths.datasets_dir={tmp_path / 'data'}", *extra], str(tmp_path / "run"))
    )


def _resumable(tmp_path: Path, extra: list[str] = ()) -> Path:
    run = tmp_path / "run"
    run_dir.check_run_config(run, _cfg(tmp_path, extra))
    (run / "checkpoints").mkdir()
    torch.save({"global_step": 6}, run / "checkpoints" / "last.ckpt")
    return run


def test_what_does_not_change_the_result_resumes(tmp_path, capsys):
    chats = write_numbered_chats(tmp_path / "d" / "c.jsonl")
    run = _resumable(tmp_path, ["data=jsonl", f"data.path={chats}"])
    same = ["data=jsonl", f"data.path={tmp_path / 'd' / '.' / 'c.jsonl'}"]  # the same file, spelled another way
    more = ["train.num_workers=2", "trainer.num_sanity_val_steps=2", "trainer.detect_anomaly=true"]
    run_dir.check_run_config(run, _cfg(tmp_path, [*same, *more, "train.max_steps=12"]))
    note = capsys.readouterr().out
    assert "train.max_steps=12 (was 6)" in note and "train.lr_decay_steps=6" in note
    run_dir.check_run_config(run, _cfg(tmp_path, [*same, "train.max_steps=12", "train.lr_decay_steps=6"]))
    with pytest.raises(run_dir.RunConfigChangedError, match=r"train\.lr_decay_steps: 6 -> 9"):
        run_dir.check_run_config(run, _cfg(tmp_path, [*same, "train.max_steps=12", "train.lr_decay_steps=9"]))
    other = write_numbered_chats(tmp_path / "e" / "c.jsonl")  # another file is another config
    with pytest.raises(run_dir.RunConfigChangedError, match=r"data\.path: "):
        run_dir.check_run_config(run, _cfg(tmp_path, ["data=jsonl", f"data.path={other}"]))


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
