"""A budgeted dataset (time_budget.minutes) is named by what was asked, the budget and the data
identity, never by the count the shares derive from the measured rates (eagle3/planning/rates.yaml):
a commit that recalibrates a rate renames no dataset, and train.py still finds the one
extract.py wrote before it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import compose

from eagle3.config.schema import run_config
from eagle3.extraction.identity import dataset_path
from eagle3.planning import cost, time_budget
from eagle3.stages import train as train_stage
from eagle3.stages.extract import run as extract
from eagle3.stages.narrow import dataset_identity


def _recalibrated(tmp_path: Path, accelerator: str, scale: float) -> Path:
    """A copy of the rates file whose runs on ``accelerator`` capture and train ``scale`` times as fast."""
    entries = yaml.safe_load(cost.RATES_FILE.read_text())
    for entry in entries:
        if entry["accelerator"] == accelerator:
            for figure in ("capture_tok_s", "capture_amx_tok_s", "capture_fp32_tok_s", "train_tok_s"):
                if figure in entry:
                    entry[figure]["value"] *= scale
            for figure in ("train_amx_tok_s", "train_fp32_tok_s"):
                entry.pop(figure, None)  # train_tok_s stands for them
    path = tmp_path / "rates.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def _name(overrides: list[str], target_dir: Path) -> tuple[str, int]:
    """The directory name extract.py writes for these overrides, and the conversations its shares size the data to."""
    cfg, shares = time_budget.sized(run_config(compose("extract", ["experiment=demo_cpu", *overrides])))
    assert shares is not None
    return dataset_path(dataset_identity(cfg, str(target_dir))).name, shares.conversations


def test_the_name_holds_the_budget_asked_not_the_count_derived(smollm2_dir, tmp_path, monkeypatch):
    asked = ["time_budget.minutes=20", "data.max_samples=null"]
    name, counted = _name(asked, smollm2_dir)
    monkeypatch.setattr(cost, "RATES_FILE", _recalibrated(tmp_path, "cpu", 0.5))
    again, recounted = _name(asked, smollm2_dir)
    assert recounted < counted and again == name  # other shares, the same dataset
    # what the user asks still names it: other minutes, passes or cap are another dataset
    others = [["time_budget.minutes=30", "data.max_samples=null"], [*asked, "time_budget.passes=3"]]
    others.append(["time_budget.minutes=20", "data.max_samples=300"])
    assert len({name, *(_name(o, smollm2_dir)[0] for o in others)}) == 4
    # a dataset without a budget is named by its data.max_samples, as before
    cfg, shares = time_budget.sized(run_config(compose("extract", ["experiment=demo_cpu", "time_budget.minutes=null"])))
    assert (
        shares is None and time_budget.asked(cfg) is None and dataset_identity(cfg, str(smollm2_dir)).named_by is None
    )


class _Found(Exception):
    pass


def test_train_finds_the_budgeted_dataset_after_a_rate_is_recalibrated(tmp_path, monkeypatch):
    """extract.py under a 90-second budget (tiny target, real ShareGPT samples), then the rates
    file says this CPU is 100x slower: train.py's shares hold fewer conversations than extract.py did,
    and still finds the dataset extract.py wrote (train.py stops there: the search is the test)."""
    args = ["experiment=tiny_test", "time_budget.minutes=1.5", f"paths.datasets_dir={tmp_path / 'data'}"]
    written = Path(extract(compose("extract", args)))
    before = time_budget.time_shares(run_config(compose("train", args)))
    monkeypatch.setattr(cost, "RATES_FILE", _recalibrated(tmp_path, "cpu", 0.01))
    after = time_budget.time_shares(run_config(compose("train", args)))
    assert before is not None and after is not None and after.conversations < before.conversations
    found: list[Path] = []
    real = train_stage.find_dataset

    def find_then_stop(cfg, target_dir):
        found.append(real(cfg, target_dir))
        raise _Found

    monkeypatch.setattr(train_stage, "find_dataset", find_then_stop)
    with pytest.raises(_Found):
        train_stage.run(compose("train", args, output_dir=str(tmp_path / "run")))
    assert found == [written]
