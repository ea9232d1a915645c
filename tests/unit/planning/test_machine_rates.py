"""A time budget plans from what runs on this machine measured (time_budget.rates=machine), and lets
regeneration answer more than the planned count while its share lasts (time_budget.fill)."""

from __future__ import annotations

import json

import pytest
from conftest import compose

from eagle3.config.schema import run_config
from eagle3.planning import machine_rates, time_budget, train_clock


@pytest.fixture(autouse=True)
def cpu_with_native_bf16_without_amx(monkeypatch):
    """The shares do not depend on the machine the suite runs on (its rates do)."""
    from eagle3.target_model import compute_dtype as cd

    monkeypatch.setattr(cd, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)


def _cfg(tmp_path, *overrides: str):
    return run_config(
        compose(
            "extract",
            [
                "experiment=smollm2_budget",
                "time_budget.minutes=10",
                "time_budget.rates=table",  # each test names what it departs from
                "time_budget.fill=false",
                f"paths.machine_rates={tmp_path / machine_rates.FILE}",
                *overrides,
            ],
        )
    )


def test_recorded_figures_replace_the_tables_only_with_rates_machine(tmp_path):
    table = _cfg(tmp_path)
    planned = time_budget.time_shares(table)
    assert planned is not None
    # this machine trains 2x and answers 1.5x as fast as the table says, and starts and evaluates sooner
    rates = time_budget.budget_rates(table)
    assert rates.train_tok_s and rates.measured and rates.measured.regen_tok_s
    path = machine_rates.record(
        table,
        {
            "train_tok_s": 2 * rates.train_tok_s,
            "regen_tok_s": 1.5 * rates.measured.regen_tok_s,
            "eval_s": 60.0,
            "start_s": 20.0,
            "capture_tok_s": None,  # not measured: skipped
        },
    )
    assert path == tmp_path / machine_rates.FILE
    assert time_budget.time_shares(table) == planned  # the table's plan ignores the record
    machine = _cfg(tmp_path, "time_budget.rates=machine")
    mine = time_budget.time_shares(machine)
    assert mine is not None
    # the minutes the table gave to starts and evaluation, and the faster steps, buy more conversations
    assert mine.conversations > 2 * planned.conversations
    assert mine.eval_s == pytest.approx(60.0) and mine.passes == pytest.approx(planned.passes, rel=0.01)
    assert any("measured on this machine" in line for line in mine.lines())
    # train.py's clock keeps the evaluation's recorded seconds, not the table's
    clock = train_clock.train_clock(machine, 100.0)
    assert clock is not None and clock.reserve_s < train_clock.train_clock(table, 100.0).reserve_s


def test_a_figure_serves_only_a_run_of_the_same_settings(tmp_path):
    cfg = _cfg(tmp_path, "time_budget.rates=machine")
    machine_rates.record(cfg, {"train_tok_s": 1e6})
    assert machine_rates.recorded(cfg) == {"train_tok_s": 1e6}
    other_batch = _cfg(tmp_path, "time_budget.rates=machine", "train.max_tokens_per_batch=4096")
    assert "train_tok_s" not in machine_rates.recorded(other_batch)
    # the on-policy step (polish.py's rounds) is slower: its rate never plans a supervised run
    onpolicy = _cfg(tmp_path, "time_budget.rates=machine", "train.onpolicy_weight=0.5")
    assert "train_tok_s" not in machine_rates.recorded(onpolicy)
    machine_rates.record(onpolicy, {"train_tok_s": 2e5})
    assert machine_rates.recorded(cfg) == {"train_tok_s": 1e6}
    with pytest.raises(ValueError, match="unknown figures.*tok_per_s"):
        machine_rates.record(cfg, {"tok_per_s": 1.0})


def test_a_damaged_record_plans_from_the_table(tmp_path):
    table = time_budget.time_shares(_cfg(tmp_path))
    (tmp_path / machine_rates.FILE).write_text('{"schema": 1, "machines": {"x": ')  # cut off
    cfg = _cfg(tmp_path, "time_budget.rates=machine")
    shares = time_budget.time_shares(cfg)
    assert shares is not None and table is not None
    assert shares.conversations == table.conversations
    assert any("nothing recorded yet" in line for line in shares.lines())
    machine_rates.record(cfg, {"start_s": 10.0})  # the record is rewritten whole
    assert json.loads((tmp_path / machine_rates.FILE).read_text())["schema"] == machine_rates.SCHEMA


def test_fill_leaves_the_count_to_the_deadline_and_names_another_dataset(tmp_path):
    fixed, fixed_shares = time_budget.sized(_cfg(tmp_path))
    filled, fill_shares = time_budget.sized(_cfg(tmp_path, "time_budget.fill=true"))
    assert fixed_shares is not None and fill_shares is not None
    assert fixed.data.max_samples == fixed_shares.conversations
    assert filled.data.max_samples is None  # the data preset's own cap (smollm2_budget: none)
    assert time_budget.asked(fixed) == {"max_samples": None, "time_budget": {"minutes": 10.0, "passes": 11.0}}
    assert time_budget.asked(filled)["time_budget"]["fill"] is True
    # the capture of twice the planned samples gets twice its share under fill, at most its share without
    from eagle3.util.clock import StageClock

    clock = StageClock()
    clock.entered -= fill_shares.regen_end_s() - clock.seconds()  # the capture starts as regeneration's share ends
    twice = 2 * fill_shares.samples
    fill_end = time_budget.capture_deadline(fill_shares, clock, twice)
    fixed_end = time_budget.capture_deadline(fixed_shares, clock, twice)
    assert fill_end is not None and fixed_end is not None
    assert fill_end.left() > fixed_end.left() + 0.9 * fill_shares.capture_s


def test_fill_without_regeneration_keeps_the_shares_count(tmp_path):
    cfg, shares = time_budget.sized(_cfg(tmp_path, "time_budget.fill=true", "data.regenerate=false"))
    assert shares is not None and not shares.fill
    assert cfg.data.max_samples == shares.conversations


def test_a_budget_plans_from_this_machine_and_fills_by_default(tmp_path):
    """What measured best at equal GPU minutes is what a budget gets without flags."""
    plain = run_config(
        compose(
            "extract",
            [
                "experiment=smollm2_budget",
                "time_budget.minutes=10",
                f"paths.machine_rates={tmp_path / machine_rates.FILE}",
            ],
        )
    )
    table = time_budget.time_shares(_cfg(tmp_path))
    assert table is not None
    machine_rates.record(plain, {"train_tok_s": 2 * time_budget.budget_rates(plain).train_tok_s})
    cfg, shares = time_budget.sized(plain)
    assert shares is not None and shares.fill and cfg.data.max_samples is None
    assert shares.conversations > table.conversations  # the recorded, faster fit asks for more data
    assert any("measured on this machine" in line for line in shares.lines())
