"""Learning-rate schedule: linear warm-up, then cosine down to ``min_ratio`` of the peak.

With a fixed number of steps the cosine spans the known number of steps (closed form). With a
wall-clock budget (``train.max_time``) the number of steps is not known in advance, and a
cosine sized for ``max_steps`` stops wherever the clock runs out, often early in its decay,
at a high learning rate: an under-trained head. So under a time budget the schedule keeps
its own progress through the cosine and, at every step, spreads what is left of it over the
steps that still fit in the remaining time, estimated from the measured time per step
(validation included). The estimate is revised each step, the progress never goes back, and
the step expected to be the last runs at the floor. The progress is part of the checkpoint,
so a resumed run continues the same curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

# Steps run after the start (or a resume) before the clock is read for the step time: the
# first steps compile the graph (train.compile) and fill the loader, and would make the
# estimate of the steps left far too low.
TIMING_WARMUP_STEPS = 3


def warmup_cosine(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / max(1, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return cosine_at(progress, min_ratio)


def cosine_at(progress: float, min_ratio: float) -> float:
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# (seconds elapsed, seconds remaining) of the training budget; remaining is None without one
Clock = Callable[[], tuple[float, float | None]]


@dataclass
class _BudgetState:
    progress: float = 0.0  # through the cosine, 0..1, never decreasing
    last_step: int = -1  # the last step a multiplier was computed for
    ref_step: int | None = None  # timing reference: step and elapsed seconds
    ref_elapsed: float = 0.0
    first_step_seen: int | None = None  # first step of this process (start or resume)
    per_step: float | None = None  # the last measured seconds per step (kept across a resume)


class BudgetedCosine:
    """The LR multiplier for optimizer step ``step`` (LambdaLR's lambda).

    ``total_steps``: the step cap (max_steps, or lr_decay_steps); ``clock``: the training
    budget's clock, or None for a pure step budget (the closed form above).
    """

    def __init__(self, *, warmup: int, total_steps: int, min_ratio: float, clock: Clock | None = None):
        self.warmup, self.total_steps, self.min_ratio = int(warmup), int(total_steps), float(min_ratio)
        self.clock = clock
        self.state = _BudgetState()
        self._multiplier = 1.0

    # ---- checkpoint
    def state_dict(self) -> dict:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = _BudgetState(**state)
        # timing restarts in the resumed process (another machine, another compile); until it
        # has a figure of its own, the one measured before the checkpoint stands in
        self.state.ref_step = None
        self.state.first_step_seen = None

    # ---- the schedule
    def steps_left(self, step: int) -> int | None:
        """Steps still to run, this one included, within both budgets; None if unknown yet."""
        left = self.total_steps - step if self.total_steps > 0 else None
        if self.clock is None:
            return left
        elapsed, remaining = self.clock()
        st = self.state
        if st.first_step_seen is None:
            st.first_step_seen = step
        if st.ref_step is None and step - st.first_step_seen >= TIMING_WARMUP_STEPS:
            st.ref_step, st.ref_elapsed = step, elapsed
        if st.ref_step is not None and step > st.ref_step:
            st.per_step = (elapsed - st.ref_elapsed) / (step - st.ref_step)
        if remaining is None or st.per_step is None:
            return left
        per_step = st.per_step
        # the step that starts before the deadline runs whole: floor() makes the one expected
        # to be the last land on the floor, at the cost of at most a step or two spent there
        by_time = max(1, math.floor(max(0.0, remaining) / max(per_step, 1e-9)))
        return by_time if left is None else min(left, by_time)

    def __call__(self, step: int) -> float:
        if self.clock is None:
            return warmup_cosine(step, warmup=self.warmup, total=self.total_steps, min_ratio=self.min_ratio)
        st = self.state
        if step <= st.last_step:  # asked again for a step already set (LambdaLR at construction)
            return self._multiplier
        st.last_step = step
        left = self.steps_left(step)
        if step < self.warmup:
            self._multiplier = (step + 1) / max(1, self.warmup)
        else:
            if step > self.warmup and left is not None:
                st.progress = min(1.0, st.progress + (1.0 - st.progress) / max(1, left))
            self._multiplier = cosine_at(st.progress, self.min_ratio)
        return self._multiplier
