"""The learning-rate schedule: a step budget follows the closed-form cosine; a wall-clock
budget (train.max_time) fits the cosine into the time left and ends at the floor, and a
resumed schedule continues the same curve (a real run: integration/test_schedule_time_cap.py)."""

from __future__ import annotations

import pytest

from eagle3.training.schedule import TIMING_WARMUP_STEPS, BudgetedCosine, warmup_cosine

MIN = 0.1


class FakeClock:
    """A training budget of `budget` seconds where each step takes `per_step` seconds."""

    def __init__(self, budget: float, per_step: float, first_step_cost: float = 0.0):
        self.budget, self.per_step, self.first = budget, per_step, first_step_cost
        self.elapsed = 0.0

    def step(self, index: int) -> None:
        self.elapsed += self.per_step + (self.first if index == 0 else 0.0)

    def __call__(self):
        return self.elapsed, self.budget - self.elapsed


def run_budget(schedule: BudgetedCosine, clock: FakeClock, start: int = 0, stop_at: int | None = None) -> list[float]:
    """Like Lightning: step s runs with multiplier(s); the clock stops the run after the step
    that crosses the budget."""
    mults, s = [], start
    while True:
        mults.append(schedule(s))
        clock.step(s)
        s += 1
        if clock.elapsed >= clock.budget or (stop_at is not None and s >= stop_at):
            return mults


def test_step_budget_is_the_closed_form_cosine():
    sched = BudgetedCosine(warmup=5, total_steps=50, min_ratio=MIN)
    assert [sched(s) for s in range(50)] == [warmup_cosine(s, warmup=5, total=50, min_ratio=MIN) for s in range(50)]


@pytest.mark.parametrize("per_step,first", [(1.0, 0.0), (0.37, 30.0), (2.5, 5.0)])
def test_time_budget_ends_at_the_floor_and_decays_monotonically(per_step, first):
    clock = FakeClock(budget=200.0, per_step=per_step, first_step_cost=first)
    sched = BudgetedCosine(warmup=10, total_steps=100_000, min_ratio=MIN, clock=clock)
    mults = run_budget(sched, clock)
    assert mults[-1] == pytest.approx(MIN)  # the last step runs at the floor
    after = mults[10:]
    assert all(a >= b - 1e-12 for a, b in zip(after, after[1:]))  # never goes back up
    # and the floor is not reached early: the last two or three steps sit at it (floor() of the
    # steps left, so that jitter in the step time cannot leave the last step above it)
    assert sum(m <= MIN + 1e-9 for m in mults) <= 3
    # half-way through the steps the cosine is about half-way down
    mid = mults[10 + (len(mults) - 10) // 2]
    assert abs(mid - (MIN + (1 - MIN) / 2)) < 0.1


def test_step_cap_wins_when_it_comes_first():
    clock = FakeClock(budget=10_000.0, per_step=1.0)
    sched = BudgetedCosine(warmup=5, total_steps=60, min_ratio=MIN, clock=clock)
    mults = run_budget(sched, clock, stop_at=60)
    assert len(mults) == 60 and mults[-1] == pytest.approx(MIN)


def test_a_resumed_schedule_continues_the_curve():
    budget, per_step = 100.0, 1.0
    clock = FakeClock(budget, per_step)
    whole = run_budget(BudgetedCosine(warmup=5, total_steps=10_000, min_ratio=MIN, clock=clock), clock)

    clock = FakeClock(budget, per_step)
    first = BudgetedCosine(warmup=5, total_steps=10_000, min_ratio=MIN, clock=clock)
    part1 = run_budget(first, clock, stop_at=40)
    second = BudgetedCosine(warmup=5, total_steps=10_000, min_ratio=MIN, clock=clock)
    second.load_state_dict(first.state_dict())  # what the checkpoint carries
    part2 = run_budget(second, clock, start=40)
    assert part1 == whole[:40]
    assert part2[-1] == pytest.approx(MIN) and len(part1) + len(part2) == len(whole)
    # the step time measured before the checkpoint stands in until the resumed process has its
    # own: with the same step time, the same curve (no jump back to the peak, no restart)
    assert part2 == pytest.approx(whole[40:], abs=1e-9)


def test_without_timing_the_progress_waits():
    clock = FakeClock(budget=100.0, per_step=1.0)
    sched = BudgetedCosine(warmup=0, total_steps=-1, min_ratio=MIN, clock=clock)
    early = [sched(s) for s in range(TIMING_WARMUP_STEPS + 1)]
    assert early == [1.0] * len(early)  # no step cap, no step time yet: stays at the peak
