"""A stage's clock counts its process's start-up once: the first stage of a young process pays its
imports and composition; a later stage of the same process (polish.py's rounds) counts from its
call, so the stages before it are not charged to it again."""

from __future__ import annotations

import pytest

from eagle3.util import clock


@pytest.fixture
def young_process(monkeypatch):
    """A process 5 s old whose start-up no clock has counted yet."""
    monkeypatch.setattr(clock, "_startup_counted", False)
    monkeypatch.setattr(clock, "process_seconds", lambda: 5.0)


def test_only_the_first_stage_of_a_process_counts_its_start_up(young_process):
    first = clock.StageClock()
    assert first.startup == 5.0 and first.counts_process_start
    assert first.seconds() >= 5.0
    later = clock.StageClock()
    assert later.startup == 0.0 and not later.counts_process_start
    assert later.seconds() < 5.0


def test_a_process_older_than_a_start_up_counts_none(monkeypatch):
    monkeypatch.setattr(clock, "_startup_counted", False)
    monkeypatch.setattr(clock, "process_seconds", lambda: clock.MAX_STARTUP_S + 1.0)
    assert not clock.StageClock().counts_process_start
