"""What more training minutes would buy (eagle3/training/validation_trend.py): the later validations
fitted in log(steps) and read at twice the steps, with a 95% prediction interval from their scatter;
a run that keeps learning says so, a flat or noisy one says its minutes want new data; too few
validations give no estimate. The callback reads a real Lightning fit's validations."""

from __future__ import annotations

import math

import pytest
from helpers.scored_fit import METRIC, scored_fit

from eagle3.training.validation_trend import MIN_POINTS, ValidationTrend, extrapolate


def test_a_log_linear_run_extends_exactly_with_no_interval():
    history = [(s, 2.0 + 0.3 * math.log(s)) for s in range(100, 1001, 100)]
    out = extrapolate(history, METRIC)
    assert out is not None and out.steps == 1000 and out.points == 6  # steps 500..1000: the later half
    assert out.now == pytest.approx(2.0 + 0.3 * math.log(1000))
    assert out.gain == pytest.approx(0.3 * math.log(2.0))  # twice the steps: + slope * ln 2
    assert out.interval == pytest.approx(0.0, abs=1e-9) and out.visible
    assert f"at 2x the training minutes {METRIC} -> {out.then:.3f} (now {out.now:.3f}: +0.208" in out.line()
    assert "would still pay" in out.line()
    assert extrapolate(history, METRIC, factor=4.0).gain == pytest.approx(0.3 * math.log(4.0))


def test_a_flat_noisy_run_shows_no_gain_beyond_its_interval():
    noise = [0.02, -0.03, 0.01, 0.025, -0.02, 0.0, -0.015, 0.03]
    history = [(s, 2.5 + noise[i % len(noise)]) for i, s in enumerate(range(500, 4001, 250))]
    out = extrapolate(history, METRIC)
    assert out is not None and not out.visible and abs(out.gain) < out.interval
    # the interval is the scatter's: a wider one for twice the noise
    louder = extrapolate([(s, 2.5 + 2 * (v - 2.5)) for s, v in history], METRIC)
    assert louder.interval == pytest.approx(2 * out.interval)
    assert "more distinct data, not more passes" in out.line()


def test_too_few_later_validations_or_none_give_no_estimate():
    assert extrapolate([], METRIC) is None
    assert extrapolate([(0, 1.0), (10, 1.5), (20, 1.7), (30, 1.8), (40, 1.9)], METRIC) is None  # 20..40: 3
    assert extrapolate([(s, 1.0 + s / 100) for s in (10, 20, 30, 40)], METRIC) is None  # 20, 30, 40
    assert extrapolate([(s, float("nan")) for s in range(10, 100, 10)], METRIC) is None
    assert MIN_POINTS == 4


def test_the_callback_keeps_each_fit_validation_of_its_metric(tmp_path):
    trend = ValidationTrend(METRIC)
    scored_fit(tmp_path, figure=lambda step: 1.0 + math.log1p(step), max_steps=40, interval=4, callbacks=[trend])
    # every validation of the fit (steps 4..40), none of the validate() after it
    assert [s for s, _ in trend.history] == list(range(4, 41, 4))
    assert all(v == pytest.approx(1.0 + math.log1p(s)) for s, v in trend.history)
    out = trend.outlook()
    assert out is not None and out.steps == 40 and out.points == 6 and out.gain > 0  # steps 20..40
