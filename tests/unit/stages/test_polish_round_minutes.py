"""polish.minutes shared by the rounds: each round's time budget is what is not yet spent, split
evenly by the rounds still to run, so a slow round leaves the later ones less, never the polish more."""

from __future__ import annotations

import pytest

from eagle3.config.polish import PolishConfig
from eagle3.stages.polish import round_minutes


def test_the_minutes_not_yet_spent_are_shared_by_the_rounds_still_to_run():
    polish = PolishConfig(rounds=3, minutes=6.0)
    assert round_minutes(polish, 1, 0.0) == pytest.approx(2.0)
    assert round_minutes(polish, 2, 150.0) == pytest.approx(1.75)  # round 1 took 2.5 min of its 2
    assert round_minutes(polish, 3, 300.0) == pytest.approx(1.0)  # the last round gets all that is left


def test_without_minutes_a_round_has_no_budget():
    assert round_minutes(PolishConfig(rounds=2, minutes=None), 1, 0.0) is None
