"""A run dir's ``dataset_manifest.json`` that cannot be read (cut short, edited, no fingerprint)
refuses the resume naming the file: it is what tells which dataset the checkpoints were trained
on, and an unreadable one used to skip that check and resume on whatever dataset the config names."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose

from eagle3.config.schema import run_config
from eagle3.training import run_dir


@pytest.fixture(scope="module")
def cfg():
    return run_config(compose("train", ["experiment=tiny_test"]))


def _run_dir(tmp_path, record: str):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {}, "global_step": 3}, run / "checkpoints" / "last.ckpt")
    (run / "dataset_manifest.json").write_text(record)
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "manifest.json").write_text(json.dumps({"fingerprint": "new"}))
    return run, ds


@pytest.mark.parametrize("record", ['{"fingerprint": "ol', '{"samples": 3}', "[]"], ids=["cut", "no key", "a list"])
def test_an_unreadable_dataset_record_refuses_the_resume_naming_it(tmp_path, cfg, record):
    run, ds = _run_dir(tmp_path, record)
    assert run_dir.resume_point(run, cfg) is not None  # there is a checkpoint to resume
    with pytest.raises(run_dir.RunConfigChangedError, match=rf"{run / 'dataset_manifest.json'}: cannot be read"):
        run_dir.check_dataset(run, cfg, ds)


def test_resume_anyway_resumes_past_an_unreadable_record(tmp_path, cfg):
    from dataclasses import replace

    run, ds = _run_dir(tmp_path, '{"fingerprint": "ol')
    run_dir.check_dataset(run, replace(cfg, resume_anyway=True), ds)
