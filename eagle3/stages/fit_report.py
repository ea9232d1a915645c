"""train.py's account of its fit: the passes made over the training split beside those a time budget
planned, and the rate over the whole fit (eagle3/training/fit_record.py), in summary.json, W&B's
summary (``fit/*``) and a line of train.py's output; beside it, what twice the training minutes would
buy by the trend of the metric that picks the export (eagle3/training/validation_trend.py:
``more_minutes``, ``more_minutes/*``), or why it cannot tell."""

from __future__ import annotations

from typing import Any

import lightning as L

from eagle3.training.datamodule import Eagle3DataModule
from eagle3.training.fit_record import FitRecord, fit_record
from eagle3.training.validation_trend import MIN_POINTS, ValidationTrend
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
    trend = next((c for c in trainer.callbacks if isinstance(c, ValidationTrend)), None)  # type: ignore[attr-defined]
    outlook = trend.outlook() if trend is not None else None
    summary["more_minutes"] = outlook.as_dict() if outlook is not None else None
    report([fit.line(), outlook.line() if outlook is not None else _no_outlook(trend)])
    if logger:
        logger.experiment.summary.update({f"fit/{k}": v for k, v in summary["fit"].items()})
        if outlook is not None:
            logger.experiment.summary.update({f"more_minutes/{k}": v for k, v in outlook.as_dict().items()})
    return fit


def _no_outlook(trend: ValidationTrend | None) -> str:
    seen = len(trend.history) if trend is not None else 0
    return (
        f"more minutes: no estimate ({seen} validations in this fit; the trend needs {MIN_POINTS} in its later "
        "half: a smaller train.val_check_interval gives them)"
    )
