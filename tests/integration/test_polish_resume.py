"""polish.py killed in the middle of a round: the rerun of the same command keeps the rounds that
finished (their exports untouched, never answered, captured or trained again) and redoes the
killed round from the last finished round's export. The tiny random Llama, HF routes only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose

import eagle3.stages.extract as extract_stage
import eagle3.stages.train as train_stage
from eagle3.planning.cost import max_time_seconds
from eagle3.stages.compose import register_polish_config
from eagle3.stages.polish import MIN_ROUND_FIT_S, round_clock
from eagle3.stages.polish import run as polish
from eagle3.stages.polish_state import STATE

TINY = ["experiment=tiny_test"]
ROUNDS = [
    "data=mixture_default",
    "data.mixture=[{name: self, source: self_prompts, weight: 1.0, prompt_max_tokens: 16}]",
    "data.regen_backend=hf",
    "data.regen_max_tokens=24",
    "data.val_fraction=0.3",
    "train.onpolicy_weight=0.5",
    "polish.rounds=2",
    "polish.prompts_per_round=6",
    "polish.steps_per_round=2",
]


class Killed(RuntimeError):
    """What the test's kill raises in the middle of a round."""


@pytest.fixture(scope="module")
def start_head(tmp_path_factory) -> tuple[Path, Path]:
    """(datasets dir, the export of a head trained for tiny_test's 6 steps): the head to polish."""
    base = tmp_path_factory.mktemp("start")
    datasets = base / "data"
    extract_stage.run(compose("extract", TINY + [f"paths.datasets_dir={datasets}"]))
    train_stage.run(compose("train", TINY + [f"paths.datasets_dir={datasets}"], output_dir=str(base / "run")))
    return datasets, Path(json.loads((base / "run" / "summary.json").read_text())["export_dir"])


def _polish_cfg(datasets: Path, export: Path, run_dir: Path, extra: tuple[str, ...] = ()):
    register_polish_config()
    overrides = TINY + [f"paths.datasets_dir={datasets}", f"train.init_from={export}", *ROUNDS, *extra]
    return compose("polish", overrides, output_dir=str(run_dir))


def test_a_round_killed_in_the_middle_restarts_from_the_last_finished_round(start_head, tmp_path, monkeypatch):
    datasets, export = start_head
    run_dir = tmp_path / "polish"
    real_train, calls = train_stage.run, {"extract": 0, "train": 0}
    real_extract = extract_stage.run

    def extract(cfg):
        calls["extract"] += 1
        return real_extract(cfg)

    def train_killed_in_round_2(cfg):
        calls["train"] += 1
        if Path(cfg.paths.output_dir).name == "round-2":
            raise Killed("killed in the middle of round 2, after its capture")
        return real_train(cfg)

    monkeypatch.setattr(extract_stage, "run", extract)
    monkeypatch.setattr(train_stage, "run", train_killed_in_round_2)
    with pytest.raises(Killed):
        polish(_polish_cfg(datasets, export, run_dir))
    state = json.loads((run_dir / STATE).read_text())
    assert [r["round"] for r in state["rounds"]] == [1]  # round 2 died before it was recorded
    assert not (run_dir / "summary.json").exists()
    first_export = Path(state["rounds"][0]["export_dir"])
    weights = first_export / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert calls == {"extract": 2, "train": 2}

    monkeypatch.setattr(train_stage, "run", real_train)
    calls.update(extract=0)
    figure = polish(_polish_cfg(datasets, export, run_dir))
    assert calls["extract"] == 1  # round 2 only: round 1 is not answered or captured again
    assert weights.stat().st_mtime_ns == written  # nor trained or exported again
    state = json.loads((run_dir / STATE).read_text())
    assert [r["round"] for r in state["rounds"]] == [1, 2]
    # round 2 started from round 1's export, on prompts of its own (its own dataset fingerprint)
    round2 = json.loads((run_dir / "round-2" / "run_config.json").read_text())["config"]
    assert round2["train"]["init_from"] == str(first_export)
    assert state["rounds"][1]["dataset_dir"] != state["rounds"][0]["dataset_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["start"] == str(export) and summary["polished_export"] == state["rounds"][1]["export_dir"]
    assert figure == pytest.approx(state["rounds"][1]["replay_accept_len"])  # eval off in tiny_test: the replay's


def test_a_run_dir_of_another_head_is_refused(start_head, tmp_path):
    datasets, export = start_head
    run_dir = tmp_path / "polish"
    run_dir.mkdir()
    (run_dir / STATE).write_text(json.dumps({"start": "/elsewhere/export", "seconds": 1.0, "rounds": []}))
    with pytest.raises(Exception, match=r"this run dir polishes train.init_from='/elsewhere/export'"):
        polish(_polish_cfg(datasets, export, run_dir))


def test_polish_minutes_end_each_rounds_training(start_head, tmp_path, monkeypatch):
    """With polish.minutes, a round trains for what the minutes leave after its answering and
    capture (train.max_time), polish.steps_per_round only its cap; a shorter max_time of the
    config's own is kept, and a round that started trains at least MIN_ROUND_FIT_S."""
    datasets, export = start_head
    real_train, caps = train_stage.run, []

    def train(cfg):
        caps.append(cfg.train.max_time)
        return real_train(cfg)

    monkeypatch.setattr(train_stage, "run", train)
    cfg = _polish_cfg(datasets, export, tmp_path / "polish", ("polish.rounds=1", "polish.minutes=5"))
    polish(cfg)
    assert len(caps) == 1 and caps[0] is not None
    assert MIN_ROUND_FIT_S <= max_time_seconds(caps[0]) < 300  # the round's answering and capture came off
    config = json.loads((tmp_path / "polish" / "round-1" / "run_config.json").read_text())["config"]
    assert config["train"]["max_time"] == caps[0] and config["train"]["max_steps"] == 2  # the cap stays

    round_cfg = compose("train", TINY + ["train.max_time=00:00:00:30"])
    assert round_clock(round_cfg, 1, 600.0).train.max_time == "00:00:00:30"  # the config's own, shorter
    assert round_clock(round_cfg, 1, 12.5).train.max_time == "00:00:00:12"
    assert max_time_seconds(round_clock(round_cfg, 1, -40.0).train.max_time) == MIN_ROUND_FIT_S
