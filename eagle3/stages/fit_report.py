"""train.py's account of its fit: the passes made over the training split beside those a time budget
planned, and the rate over the whole fit (eagle3/training/fit_record.py), in summary.json, W&B's
summary (``fit/*``) and a line of train.py's output."""

from __future__ import annotations

from typing import Any

import lightning as L

from eagle3.training.datamodule import Eagle3DataModule
from eagle3.training.fit_record import FitRecord, fit_record
from eagle3.util.report import report


def report_fit(
    trainer: L.Trainer,
    datamodule: Eagle3DataModule,
    logger: Any,
    summary: dict[str, Any],
    planned_passes: float | None,
) -> FitRecord:
    """The fit of ``trainer`` (summary["fit_seconds"] long) into ``summary["fit"]``, W&B and a line."""
    fit = fit_record(trainer, datamodule, summary["fit_seconds"], planned_passes)
    summary["fit"] = fit.as_dict()
    report([fit.line()])
    if logger:
        logger.experiment.summary.update({f"fit/{k}": v for k, v in summary["fit"].items()})
    return fit
