"""train.py's share of a time budget (eagle3/planning/time_budget.py plans the whole): what the
extraction recorded it spent, what this start-up took, what the end keeps (validation, export, the
acceptance evaluation); training gets the rest as Lightning's max_time, and the pipeline's minutes
as they went end in summary.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from eagle3.config.schema import RunConfig
from eagle3.planning import cost
from eagle3.planning.time_budget import budget_rates, end_reserve
from eagle3.util.clock import StageClock
from eagle3.util.report import minutes

MIN_FIT_FRACTION = 0.1  # of the budget: what training gets however long the extraction took


@dataclass(frozen=True)
class TrainClock:
    """train.py's share: what the extraction spent, what is left for fit."""

    total_s: float
    extract_s: float | None  # recorded by extract.py in the dataset (None: not recorded)
    started_s: float  # this process so far
    reserve_s: float  # after fit: validation, export, the acceptance evaluation
    fit_s: float
    stage: StageClock  # train.py's own

    def over_s(self) -> float:
        """How far past the budget the plan now ends (0: inside): the training floor's cost."""
        return max(0.0, (self.extract_s or 0.0) + self.started_s + self.reserve_s + self.fit_s - self.total_s)

    def max_time(self) -> str:
        """Lightning's "DD:HH:MM:SS" for fit_s (whole seconds, at least one)."""
        return cost.lightning_max_time(self.fit_s)

    def line(self) -> str:
        spent = "not recorded in the dataset: counted as 0" if self.extract_s is None else minutes(self.extract_s)
        if self.over_s() > 0:
            return (
                f"time budget: {minutes(self.total_s)} in all, and the extraction took {spent}: with this start-up "
                f"({minutes(self.started_s)}) and the end (~{minutes(self.reserve_s)}) nothing is left to train, so "
                f"training gets its floor, {minutes(self.fit_s)} ({MIN_FIT_FRACTION:.0%} of the budget; "
                f"train.max_time={self.max_time()}): the run ends ~{minutes(self.over_s())} past its minutes"
            )
        return (
            f"time budget: {minutes(self.total_s)} in all: extraction {spent}, this start-up {minutes(self.started_s)}, "
            f"kept for validation, export and evaluation ~{minutes(self.reserve_s)}; training gets "
            f"{minutes(self.fit_s)} (train.max_time={self.max_time()})"
        )

    def outcome(self) -> dict[str, float | bool]:
        """The pipeline's minutes as they went (summary.json's ``time_budget``), at the end of train.py."""
        train_s = self.stage.seconds()
        total = (self.extract_s or 0.0) + train_s
        return {
            "minutes": round(self.total_s / 60.0, 3),
            "extract_s": round(self.extract_s or 0.0, 1),
            "fit_s": round(self.fit_s, 1),  # train.max_time: the minutes training was given
            "train_s": round(train_s, 1),
            "total_s": round(total, 1),
            "inside": total <= self.total_s,
        }


def train_clock(
    cfg: RunConfig,
    extract_s: float | None,
    stage: StageClock | None = None,
    rates: cost.RunRates | None = None,
) -> TrainClock | None:
    """train.py's clock under cfg.time_budget.minutes (``stage``: the stage's, from its call;
    ``rates``: cfg's, default cost.run_rates(cfg)); None without a budget."""
    if cfg.time_budget.minutes is None:
        return None
    reserve = end_reserve(cfg, (rates or budget_rates(cfg)).measured)
    total = float(cfg.time_budget.minutes) * 60.0
    stage = stage or StageClock()
    started = stage.seconds()
    left = total - (extract_s or 0.0) - started - reserve
    # an extraction that overran its share (engines that start slower than the rates say) leaves
    # training a floor: a head a little past the minutes, not an error after them with the data
    # captured and nothing trained; line() says by how much the run passes its minutes
    fit = max(left, MIN_FIT_FRACTION * total)
    return TrainClock(total, extract_s, started, reserve, fit, stage)


def timed_train(cfg: RunConfig, clock: TrainClock) -> RunConfig:
    """cfg whose fit ends at the clock: train.max_time from it, train.max_steps out of the way
    (the cosine is fitted to the time: eagle3/training/schedule.py)."""
    steps = max(cfg.train.max_steps, 10**7)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_time=clock.max_time(), max_steps=steps))


def outcome_line(outcome: dict) -> str:
    """One line for TrainClock.outcome(): the pipeline's minutes against its budget."""
    within = "inside" if outcome["inside"] else "OVER"
    return (
        f"time budget: {minutes(outcome['total_s'])} of {outcome['minutes']:g} min ({within}): extraction "
        f"{minutes(outcome['extract_s'])}, train.py {minutes(outcome['train_s'])}"
    )
