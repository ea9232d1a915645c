"""What a fit did with its data: passes made over the training split (beside the passes a time budget
planned), tokens per second over the whole fit, validations included, and the share of the steps'
time spent waiting for batches over the whole fit (the logged train/data_wait_frac is a window's).

The budget plans a number of passes; a machine faster than its rates spends the spare minutes on
more of them over the same tokens, which memorises the source rather than generalising. The run
says how many it made, in summary.json (``fit``), W&B's summary (``fit/*``) and train.py's last
lines, so a user sees re-reading where it happens; the stage records the rate on this machine for
the next budget's plan (eagle3/planning/machine_rates.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import lightning as L

from eagle3.training.callbacks import TokenThroughput
from eagle3.training.datamodule import Eagle3DataModule


@dataclass(frozen=True)
class FitRecord:
    tokens: int  # sample tokens stepped on, over all ranks
    train_tokens: int  # tokens of the training split (one pass)
    seconds: float  # the fit's wall time: steps, validations, checkpoints
    passes_planned: float | None  # time_budget.passes (None: no budget)
    # the steps' time spent waiting for batches, over the whole fit (None: no step timed)
    data_wait_frac: float | None = None

    @property
    def passes(self) -> float:
        return self.tokens / self.train_tokens if self.train_tokens else 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | None]:
        wait = None if self.data_wait_frac is None else round(self.data_wait_frac, 4)
        return {**asdict(self), "passes": round(self.passes, 2), "tok_s": round(self.tok_s, 1), "data_wait_frac": wait}

    def line(self) -> str:
        planned = f" ({self.passes_planned:g} planned by the time budget)" if self.passes_planned else ""
        return (
            f"fit: {self.passes:.1f} passes over {self.train_tokens:,} training tokens{planned}; "
            f"{self.tok_s:,.0f} tok/s over {self.seconds:.0f} s of fit, validations included"
            + (f"; data wait {self.data_wait_frac:.1%} of the steps' time" if self.data_wait_frac is not None else "")
        )


def fit_record(
    trainer: L.Trainer, datamodule: Eagle3DataModule, seconds: float, passes_planned: float | None
) -> FitRecord:
    """The fit just made by ``trainer`` on ``datamodule``'s training split, in ``seconds``."""
    counter = next((c for c in trainer.callbacks if isinstance(c, TokenThroughput)), None)  # type: ignore[attr-defined]
    per_rank = counter.total_tokens if counter is not None else 0
    wait = counter.data_wait_frac() if counter is not None else None
    lengths = datamodule.dataset.lengths
    train_tokens = int(lengths[datamodule.train_idx].sum()) if datamodule.train_idx else 0
    return FitRecord(int(per_rank * trainer.world_size), train_tokens, float(seconds), passes_planned, wait)
