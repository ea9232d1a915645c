"""selection.*: the selection set's own config (derived from the run's), the metric that picks the
export, and its minutes in the time budget's plan."""

from __future__ import annotations

import pytest
from conftest import compose

from eagle3.config.errors import ConfigError
from eagle3.config.schema import run_config
from eagle3.planning import time_budget
from eagle3.stages.selection import picking_metric, selection_config

BUDGET = ["experiment=demo_cpu", "time_budget.minutes=30", "data.regenerate=true", "data.max_samples=null"]


def test_the_selection_set_is_its_own_answered_source_with_nothing_held_out():
    cfg = run_config(compose("extract", ["experiment=demo_cpu", "selection.samples=64"]))
    assert selection_config(run_config(compose("extract", ["experiment=demo_cpu"]))) is None
    picked = selection_config(cfg)
    assert picked is not None
    data = picked.data
    assert [(e.name, e.source.value, e.max_samples) for e in data.mixture] == [("select", "self_prompts", 64)]
    assert data.max_samples == 64 and data.val_fraction == 0.0 and data.regenerate and data.regen_temperature == 0.0
    assert data.seed == cfg.selection.seed != cfg.data.seed  # not the prompts a training mixture writes
    assert data.name != cfg.data.name and picked.time_budget.minutes is None and picked.selection.samples == 0
    # the same model, layers, capture and storage: batches of both decode alike
    assert (picked.model, picked.layers, picked.capture) == (cfg.model, cfg.layers, cfg.capture)


def test_a_file_source_needs_its_path_and_online_training_has_no_selection_set():
    with pytest.raises(ConfigError, match=r"selection.source=jsonl: expected selection.path"):
        selection_config(
            run_config(compose("extract", ["experiment=demo_cpu", "selection.samples=8", "selection.source=jsonl"]))
        )
    online = ["experiment=demo_cpu", "selection.samples=8", "train.hidden_states=online"]
    with pytest.raises(ConfigError, match=r"expected 0 with train.hidden_states=online"):
        selection_config(run_config(compose("extract", online)))


def test_the_metric_is_read_on_the_selection_set_where_there_is_one():
    assert picking_metric("val/replay_accept_len", True) == "select/replay_accept_len"
    assert picking_metric("val/loss", True) == "select/loss"
    assert picking_metric("val/replay_accept_len", False) == "val/replay_accept_len"


def test_its_minutes_come_out_of_the_plan_before_the_answers_share():
    plain = time_budget.time_shares(run_config(compose("train", BUDGET)))
    picked = time_budget.time_shares(run_config(compose("train", [*BUDGET, "selection.samples=256"])))
    assert plain is not None and picked is not None
    assert plain.selection_s == 0 and picked.selection_s > 0
    assert picked.fixed_s == pytest.approx(plain.fixed_s + picked.selection_s)
    assert picked.conversations < plain.conversations
    # answered first: the answers' share ends that much later on extract.py's clock
    assert picked.regen_end_s() == pytest.approx(
        picked.start_s + picked.selection_s + picked.regen_start_s + picked.regen_s
    )
    assert "the selection set ~" in picked.lines()[0]
