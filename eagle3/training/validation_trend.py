"""What more training minutes would buy this run, read from its own validations.

Each validation's value of the metric that picks the export is kept against the step it was read
at (``ValidationTrend``, a callback). At the end the later validations are fitted as a line in
log(steps), the shape of a head that has stopped learning fast, and extended to ``factor`` times the
steps: at the same rate, ``factor`` times the training minutes. The estimate carries a 95%
prediction interval from the scatter of the fitted points around the line, so a run whose
validations are flat or noisy says so rather than promising a gain. The trend is that of the set
the metric is read on: the training source's own split (which also rewards memorising it) unless
a selection set picks the export.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import lightning as L

# two-sided 95% quantiles of Student's t by degrees of freedom (1..10); 1.96 beyond 30
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}
MIN_POINTS = 4  # a line through fewer later validations says nothing about its scatter


def _t95(dof: int) -> float:
    if dof in _T95:
        return _T95[dof]
    return 2.09 if dof <= 20 else 2.04 if dof <= 30 else 1.96


@dataclass(frozen=True)
class TrendOutlook:
    metric: str  # e.g. val/sim_accept_len or select/replay_accept_len
    points: int  # validations fitted
    steps: int  # the last fitted validation's step
    factor: float  # the steps (and, at this run's rate, the minutes) the estimate is for, as a multiple
    now: float  # the line's value at ``steps``
    then: float  # the line's value at ``factor * steps``
    interval: float  # half-width of the 95% prediction interval at ``factor * steps``

    @property
    def gain(self) -> float:
        return self.then - self.now

    @property
    def visible(self) -> bool:
        """A gain larger than the interval around it: more minutes of this data would show."""
        return self.gain > self.interval

    def as_dict(self) -> dict[str, float | int | str | bool]:
        return {**asdict(self), "gain": round(self.gain, 4), "visible": self.visible}

    def line(self) -> str:
        figure = f"{self.then:.3f} (now {self.now:.3f}: {self.gain:+.3f} +- {self.interval:.3f}, 95%)"
        trend = f"the trend of {self.points} validations to step {self.steps:,}"
        verdict = (
            "more minutes of this data would still pay"
            if self.visible
            else "no gain the trend can tell from its scatter: more distinct data, not more passes"
        )
        return f"more minutes: at {self.factor:g}x the training minutes {self.metric} -> {figure} by {trend}; {verdict}"


def extrapolate(history: list[tuple[int, float]], metric: str, factor: float = 2.0) -> TrendOutlook | None:
    """The later half of ``history`` ((step, value) per validation, steps > 0) fitted as
    value = a + b * log(step) and read at ``factor`` times its last step; None when fewer than
    MIN_POINTS validations fall in it or their steps do not spread."""
    points = sorted((s, v) for s, v in history if s > 0 and math.isfinite(v))
    if not points:
        return None
    last = points[-1][0]
    later = [(math.log(s), v) for s, v in points if s * 2 >= last]  # past the warm-up's fast rise
    n = len(later)
    if n < MIN_POINTS:
        return None
    x_mean = sum(x for x, _ in later) / n
    y_mean = sum(y for _, y in later) / n
    sxx = sum((x - x_mean) ** 2 for x, _ in later)
    if sxx <= 0:
        return None
    slope = sum((x - x_mean) * (y - y_mean) for x, y in later) / sxx
    line = lambda x: y_mean + slope * (x - x_mean)  # noqa: E731 - the fitted line, read twice below
    scatter = math.sqrt(sum((y - line(x)) ** 2 for x, y in later) / (n - 2))
    x_then = math.log(factor * last)
    half = _t95(n - 2) * scatter * math.sqrt(1 + 1 / n + (x_then - x_mean) ** 2 / sxx)
    return TrendOutlook(metric, n, last, factor, line(math.log(last)), line(x_then), half)


class ValidationTrend(L.Callback):
    """(step, value of ``metric``) at the end of every validation of the fit, sanity checks aside."""

    def __init__(self, metric: str):
        self.metric = metric
        self.history: list[tuple[int, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        value = trainer.callback_metrics.get(self.metric)
        if value is not None:
            self.history.append((int(trainer.global_step), float(value)))

    def outlook(self, factor: float = 2.0) -> TrendOutlook | None:
        return extrapolate(self.history, self.metric, factor)
