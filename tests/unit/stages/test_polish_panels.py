"""polish.py's per-round figures: the W&B panels (vLLM's where it measured, the replay's else) and
the state file a resumed polish reads back."""

from __future__ import annotations

import json

import pytest

from eagle3.config.errors import ConfigError
from eagle3.stages.polish_log import round_metrics
from eagle3.stages.polish_state import STATE, PolishState, RoundRecord, load_state


def _record(number: int, served: dict | None = None) -> RoundRecord:
    return RoundRecord(
        round=number,
        export_dir=f"/runs/p/round-{number}/export",
        dataset_dir=f"/data/d{number}",
        seconds=10.0,
        tokens=500,
        steps=4,
        train_tok_s=100.0,
        replay_accept_len=1.5,
        replay_acc_pos=[0.4, 0.1],
        served=served,
    )


def test_the_panels_take_vllms_figures_where_it_measured_the_round():
    served = {"mean_acceptance_length": 1.8, "per_position_acceptance_rate": [0.6, 0.2]}
    m = round_metrics(_record(2, served))
    assert m["polish/accept_len"] == 1.8 and m["polish/replay_accept_len"] == 1.5
    assert (m["polish/acc_pos0"], m["polish/acc_pos1"]) == (0.6, 0.2)
    replayed = round_metrics(_record(2))
    assert replayed["polish/accept_len"] == 1.5 and "polish/served_accept_len" not in replayed
    assert (replayed["polish/acc_pos0"], replayed["polish/acc_pos1"]) == (0.4, 0.1)


def test_the_state_continues_from_the_last_finished_round(tmp_path):
    state = load_state(tmp_path, "/heads/start")
    assert state.head == "/heads/start"
    state.add(_record(1), tmp_path)
    state.add(_record(2), tmp_path)
    again = load_state(tmp_path, "/heads/start")
    assert again == state and again.head == "/runs/p/round-2/export" and again.seconds == 20.0


def test_a_state_of_another_head_or_an_unreadable_one_is_refused(tmp_path):
    PolishState(start="/heads/other").save(tmp_path)
    with pytest.raises(
        ConfigError, match=r"polishes train.init_from='/heads/other', got train.init_from='/heads/start'"
    ):
        load_state(tmp_path, "/heads/start")
    (tmp_path / STATE).write_text(json.dumps({"start": "/heads/start"}))
    with pytest.raises(ConfigError, match=r"unreadable polish state \(KeyError"):
        load_state(tmp_path, "/heads/start")
