"""The per-position acceptance plot (PNG): one bar group per draft position, one bar per
prompt set (the held-out suite first, the validation split labelled in-distribution), the mean
acceptance length of each and its interval in the legend."""

from __future__ import annotations

import math
from pathlib import Path

from eagle3.evaluation.prompts import SET_LABELS
from eagle3.evaluation.report import PNG_NAME, AcceptanceReport


def save_acceptance_plot(report: AcceptanceReport, out_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    k = report.num_draft_tokens
    sets = [(report.headline_key, report.overall)] + [(n, f) for n, f in report.by_source.items() if f.prompts]
    width = 0.8 / len(sets)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * k + 2), 3.6), dpi=120)
    for i, (name, figs) in enumerate(sets):
        rates = [r if r is not None and math.isfinite(r) else 0.0 for r in figs.per_position_acceptance_rate]
        xs = [p + (i - (len(sets) - 1) / 2) * width for p in range(len(rates))]
        length = figs.mean_acceptance_length
        interval = report.intervals.get(name)
        span = (
            f" [{interval['mean_acceptance_length'][0]:.2f}, {interval['mean_acceptance_length'][1]:.2f}]"
            if interval
            else " [interval n/a]"
            if report.no_interval_reason is not None
            else ""
        )
        label = (
            f"{SET_LABELS.get(name, name)} (n={figs.prompts}, accept len {length:.2f}{span})"
            if math.isfinite(length)
            else f"{SET_LABELS.get(name, name)} (n={figs.prompts})"
        )
        bars = ax.bar(xs, rates, width=width, label=label)
        ax.bar_label(bars, labels=[f"{r:.2f}" for r in rates], fontsize=7, padding=1)
    ax.set_xticks(range(k), [str(p) for p in range(k)])
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"EAGLE-3 acceptance per draft position (vLLM, K={k})", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path = Path(out_dir) / PNG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
