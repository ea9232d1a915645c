"""polish.py killed in the middle of a round: the rerun of the same command keeps the rounds that
finished (their exports untouched, never answered, captured or trained again) and redoes the
killed round from the last finished round's export. The tiny random Llama, HF routes only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose
from omegaconf import OmegaConf

import eagle3.stages.extract as extract_stage
import eagle3.stages.train as train_stage
from eagle3.config.errors import ConfigError
from eagle3.config.schema import run_config
from eagle3.planning import machine_rates
from eagle3.stages.compose import register_polish_config
from eagle3.stages.polish import round_config
from eagle3.stages.polish import run as polish
from eagle3.stages.polish_state import STATE
from eagle3.store import Manifest

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


def test_polish_minutes_make_each_round_a_time_budget(start_head, tmp_path, monkeypatch):
    """With polish.minutes, what is not yet spent, shared by the rounds still to run, is each round's
    time_budget.minutes: its answering and capture are sized by the shares, its training gets what
    they leave (train.max_time from the budget's clock), and polish.steps_per_round does not bind."""
    datasets, export = start_head
    run_dir, rates = tmp_path / "polish", tmp_path / "machine_rates.json"
    cfg = _polish_cfg(
        datasets, export, run_dir, ("polish.rounds=2", "polish.minutes=1.6", f"paths.machine_rates={rates}")
    )
    # this machine's stage start recorded as quick: the table's CPU figure (25 s a stage) leaves a 48 s round nothing
    first = run_config(round_config(cfg, OmegaConf.to_object(cfg.polish), 1, str(export), run_dir, 0.8))
    machine_rates.record(first, {"start_s": 1.0})
    real_train, seen = train_stage.run, []

    def train(round_cfg):
        seen.append(round_cfg)
        return real_train(round_cfg)

    monkeypatch.setattr(train_stage, "run", train)
    polish(cfg)
    state = json.loads((run_dir / STATE).read_text())
    assert [r["round"] for r in state["rounds"]] == [1, 2]
    assert seen[0].time_budget.minutes == pytest.approx(0.8)  # 1.6 minutes, two rounds to run
    assert seen[1].time_budget.minutes == pytest.approx((96.0 - state["rounds"][0]["seconds"]) / 60.0)
    for number, minutes in ((1, seen[0].time_budget.minutes), (2, seen[1].time_budget.minutes)):
        summary = json.loads((run_dir / f"round-{number}" / "summary.json").read_text())
        assert summary["time_budget"]["minutes"] == pytest.approx(minutes, abs=1e-3)  # train.py's clock was the round's
        assert summary["global_step"] > 2  # trained to its clock, past steps_per_round's 2
        samples = Manifest.read(Path(state["rounds"][number - 1]["dataset_dir"])).num_samples
        assert 0 < samples <= 6  # polish.prompts_per_round: the most a round answers


def test_polish_minutes_too_few_for_a_round_are_refused_before_any_work(start_head, tmp_path):
    datasets, export = start_head
    run_dir = tmp_path / "polish"
    cfg = _polish_cfg(datasets, export, run_dir, ("polish.rounds=2", "polish.minutes=0.5"))
    with pytest.raises(ConfigError, match=r"polish\.minutes=0\.5: round 1 gets 0\.25 min: .*fixed costs"):
        polish(cfg)
    assert not (run_dir / "round-1").exists()
