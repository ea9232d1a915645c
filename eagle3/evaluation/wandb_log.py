"""Put the acceptance report on a W&B run: `eval/*` scalars (also in the run summary, so
dashboards can sort runs by them), a table of per-position rates and the plot.

`eval/mean_acceptance_length` is the held-out suite's (the headline), with its interval
(`eval/mean_acceptance_length_low`/`_high`); `eval/<set>/...` per prompt set and
`eval/category/<name>/...` per category; the validation split's figure is logged under `eval/val/`
and again as `eval/in_distribution/mean_acceptance_length`, and the table's `label` column names
each set ("validation split (in-distribution)")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eagle3.evaluation.prompts import SET_LABELS, VAL
from eagle3.evaluation.report import AcceptanceReport

_SCALARS = (
    "mean_acceptance_length",
    "acceptance_rate",
    "tokens_per_s_with_head",
    "tokens_per_s_without_head",
    "eval_engines_tok_s_ratio",  # the evaluation engines' ratio, not a serving speed-up
    "greedy_match_rate",
)


def eval_scalars(report: AcceptanceReport) -> dict[str, float]:
    """eval/<figure> over all prompts, eval/<source>/<figure> per source, eval/accept_rate_pos<i>."""
    out: dict[str, float] = {}
    sets = [("", report.overall)] + [(f"{name}/", fig) for name, fig in report.by_source.items() if fig.prompts]
    for prefix, fig in sets:
        for key in _SCALARS:
            value = getattr(fig, key)
            if value is not None and math.isfinite(float(value)):
                out[f"eval/{prefix}{key}"] = float(value)
        for i, rate in enumerate(fig.per_position_acceptance_rate):
            if rate is not None and math.isfinite(rate):
                out[f"eval/{prefix}accept_rate_pos{i}"] = float(rate)
    out["eval/num_draft_tokens"] = float(report.num_draft_tokens)
    for name, interval in report.intervals.items():
        if interval:
            prefix = "" if name == report.headline_key else f"{name}/"
            out[f"eval/{prefix}mean_acceptance_length_low"] = float(interval["mean_acceptance_length"][0])
            out[f"eval/{prefix}mean_acceptance_length_high"] = float(interval["mean_acceptance_length"][1])
    for name, c in report.by_category.items():
        if c["prompts"] and math.isfinite(c["mean_acceptance_length"]):
            out[f"eval/category/{name}/mean_acceptance_length"] = float(c["mean_acceptance_length"])
    val = report.by_source.get(VAL)
    if val is not None and math.isfinite(val.mean_acceptance_length):
        out["eval/in_distribution/mean_acceptance_length"] = float(val.mean_acceptance_length)
    if report.train_side_replay:  # the same val prompts replayed train-side: beside vLLM's figure
        out["eval/val/train_side_replay_accept_len"] = float(report.train_side_replay["replay_accept_len"])
    for source, served in report.served_replay.items():  # the head replayed on vLLM's own outputs
        prefix = "" if source == "all" else f"{source}/"
        out[f"eval/{prefix}served_replay_accept_len"] = float(served["replay_accept_len"])
    return out


def log_report(report: AcceptanceReport, png: Path | None, run: Any = None) -> bool:
    """Log to `run` (e.g. Lightning's `WandbLogger.experiment`), else to `wandb.run`.
    False when there is no run (nothing logged). Lightning's logger creates its run with
    reinit="create_new", which leaves `wandb.run` unset: train.py must pass its run."""
    if run is None:
        try:
            import wandb
        except ImportError:
            return False
        run = wandb.run
    if run is None:
        return False
    import wandb

    scalars = eval_scalars(report)
    columns: list[str | int] = ["prompts", "label", "position", "acceptance_rate", "accepted_tokens", "drafts"]
    table = wandb.Table(columns=columns)
    sets = [(report.headline_key, report.overall)]
    sets += [(name, fig) for name, fig in report.by_source.items() if fig.prompts]
    for name, fig in sets:
        for i, (rate, acc) in enumerate(zip(fig.per_position_acceptance_rate, fig.accepted_per_position)):
            rate_or_none = None if rate is None or not math.isfinite(rate) else rate
            table.add_data(name, SET_LABELS.get(name, name), i, rate_or_none, acc, fig.drafts)
    payload: dict[str, Any] = dict(scalars)
    payload["eval/acceptance_per_position"] = table
    if png is not None and Path(png).is_file():
        payload["eval/acceptance_plot"] = wandb.Image(str(png))
    run.log(payload)
    run.summary.update(scalars)
    return True
