"""The budget curve's plot (docs/budget_curve.svg) from its data file, docs/data/budget_curve.yaml:
each head's held-out acceptance against the minutes of its budget, its 95% interval where
measured, a fresh machine's first run apart from runs on a warmed one.

    python scripts/budget_curve_plot.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")  # files only: no display on servers
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CURVE = ROOT / "docs" / "data" / "budget_curve.yaml"
PLOT = ROOT / "docs" / "budget_curve.svg"
STYLE = {
    "warm": ("o", "C0", "warmed machine"),
    "fresh": ("s", "C3", "fresh machine (one-time costs inside the minutes)"),
}


def main() -> int:
    curve = yaml.safe_load(CURVE.read_text())
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for machine, (marker, color, label) in STYLE.items():
        points = [p for p in curve["points"] if p["machine"] == machine]
        if not points:
            continue
        x = [p["minutes"] for p in points]
        y = [p["acceptance"] for p in points]
        low = [p["acceptance"] - p["interval"][0] if p.get("interval") else 0.0 for p in points]
        high = [p["interval"][1] - p["acceptance"] if p.get("interval") else 0.0 for p in points]
        ax.errorbar(x, y, yerr=[low, high], fmt=marker, color=color, label=label, capsize=3)
    ax.set_xlabel("time_budget.minutes (whole pipeline)")
    ax.set_ylabel("acceptance length, held-out suite (K=3)")
    ax.set_title(f"The budgeted recipe on one {curve['card']}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    plt.rcParams["svg.hashsalt"] = "budget_curve"  # stable ids: the file changes only with the data
    fig.savefig(PLOT, metadata={"Date": None})
    print(PLOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
