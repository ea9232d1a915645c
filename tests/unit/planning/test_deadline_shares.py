"""time_budget's deadlines as shares of the budget: where each stage's deadline ends, what an
overrun regeneration leaves the capture, and validation spread through the capture order."""

from __future__ import annotations

import pytest
from conftest import compose
from helpers import TickingClock

from eagle3.data.split import interleaved
from eagle3.planning import time_budget
from eagle3.util.clock import StageClock


def test_validation_is_spread_through_the_capture_order():
    train, val = [f"t{i}" for i in range(30)], [f"v{i}" for i in range(10)]
    order = interleaved(train, val)
    assert sorted(order) == sorted(train + val)
    assert [s for s in order if s[0] == "t"] == train and [s for s in order if s[0] == "v"] == val
    for cut in (4, 12, 20, 40):  # any prefix holds about a quarter of validation samples
        assert abs(sum(s[0] == "v" for s in order[:cut]) - cut / 4) <= 1


def test_the_deadlines_end_where_the_shares_say():
    from eagle3.config.schema import run_config

    shares = time_budget.time_shares(run_config(compose("extract", ["experiment=smollm2_budget"])))
    assert shares is not None and shares.regen_s > 0
    assert shares.regen_end_s() == pytest.approx(shares.start_s + shares.regen_start_s + shares.regen_s)
    assert shares.extract_end_s() == pytest.approx(shares.regen_end_s() + shares.capture_s)
    # what the extraction may spend leaves training its share, the second start and the end
    assert shares.total_s - shares.extract_end_s() == pytest.approx(
        shares.train_s + shares.fixed_s - shares.start_s - shares.regen_start_s - shares.capture_start_s
    )
    clock = StageClock()
    regen = time_budget.regen_deadline(shares, clock)
    capture = time_budget.capture_deadline(shares, clock, shares.samples)
    assert regen is not None and capture is not None
    overrun = time_budget.CAPTURE_OVERRUN_OF_TRAIN * shares.train_s
    assert overrun > 0 and (regen.at_s, capture.at_s) == (shares.regen_end_s(), shares.extract_end_s() + overrun)
    # filling, the count caps nothing: the first batch (before any pace) is half the plan's count
    assert shares.fill and regen.first_batch == shares.conversations // 2
    fixed = time_budget.time_shares(
        run_config(compose("extract", ["experiment=smollm2_budget", "time_budget.fill=false"]))
    )
    assert fixed is not None and time_budget.regen_deadline(fixed, clock).first_batch is None
    assert time_budget.regen_deadline(None, clock) is None and time_budget.capture_deadline(None, clock, 5) is None


def test_a_regeneration_that_overran_leaves_capture_its_own_share():
    """Its first batch always runs: when regeneration ends past the extraction's share, capture
    still gets the minutes its samples' share was sized to take, from now (and the overrun)."""
    from eagle3.config.schema import run_config

    shares = time_budget.time_shares(run_config(compose("extract", ["experiment=smollm2_budget"])))
    assert shares is not None
    late = TickingClock()
    late.reads = int(shares.extract_end_s()) + 100  # regeneration ended 100 s past the extraction's share
    half = time_budget.capture_deadline(shares, late, shares.samples // 2)
    assert half is not None
    own = shares.capture_s * (shares.samples // 2) / shares.samples
    assert half.at_s == pytest.approx(late.reads + own + time_budget.CAPTURE_OVERRUN_OF_TRAIN * shares.train_s)


def test_a_vllm_capture_plans_its_engines_start():
    """capture=vllm starts an engine (profile, compilation) that its tok/s leaves out: the plan
    holds it inside the extraction's share, from the table's figure for this kind of machine."""
    from eagle3.config.schema import run_config
    from eagle3.planning import cost

    gpu = [
        "experiment=smollm2_budget",
        "topology=gpu1",
        "sizes=gpu",
        "data.regen_backend=vllm",
        "time_budget.rates=table",
    ]
    hf = time_budget.time_shares(run_config(compose("extract", gpu)))
    vllm_cfg = run_config(compose("extract", gpu + ["capture=vllm"]))
    vllm = time_budget.time_shares(vllm_cfg)
    assert hf is not None and vllm is not None
    start = cost.run_rates(vllm_cfg).measured.capture_vllm_start_s
    assert start > 0 and hf.capture_start_s == 0 and vllm.capture_start_s == start
    assert vllm.fixed_s == pytest.approx(hf.fixed_s + start)
    assert vllm.extract_end_s() == pytest.approx(vllm.regen_end_s() + start + vllm.capture_s)
    assert vllm.conversations < hf.conversations  # the engine's minutes come out of the data's


def test_a_capture_slower_than_the_rates_keeps_the_answers_training_pays_for_it():
    """The answers cost far more to write than to capture: a capture at three quarters of the
    planned rate (as one H100 captured fp8 + top-32 against the table's rate) still
    captures every regenerated sample, taking part of training's share; one ten times slower is
    cut where half of training's share is gone, so training keeps the rest."""
    from eagle3.config.schema import run_config

    for gpu in ([], ["topology=gpu1", "sizes=gpu", "data.regen_backend=vllm", "time_budget.rates=table"]):
        shares = time_budget.time_shares(run_config(compose("extract", ["experiment=smollm2_budget", *gpu])))
        assert shares is not None and shares.capture_s > 0 and shares.train_s > 0
        clock = StageClock()
        clock.entered -= shares.regen_end_s() + shares.capture_start_s - clock.seconds()  # capture starts on time
        deadline = time_budget.capture_deadline(shares, clock, shares.samples)
        assert deadline is not None
        slower = shares.capture_s / 0.75
        assert deadline.left() >= slower > shares.capture_s
        far_slower = 10 * shares.capture_s
        assert deadline.left() < far_slower
        assert shares.train_s - (deadline.left() - shares.capture_s) == pytest.approx(shares.train_s / 2, rel=1e-3)
