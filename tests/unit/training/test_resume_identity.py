"""A resume compares what changes the result, and nothing else (issue 48): the loader's processes, Lightning's sanity check, the run's length and another spelling of the
same data file resume."""

from __future__ import annotations

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
