"""The tables of measured rates and step costs in docs/, generated from the data files the code
reads (eagle3/planning/rates.yaml, eagle3/serving/step_costs.yaml), so a doc never shows a figure
the planner or the advice does not use; and the budget curve's table from its data file
(docs/data/budget_curve.yaml, which scripts/budget_curve_plot.py draws).

    python scripts/docs_tables.py          # rewrite the generated blocks in docs/ (records included)
    python scripts/docs_tables.py --check  # exit 1 naming each block that differs (the suite runs it)

A generated block sits between `<!-- generated: NAME -->` and `<!-- end generated -->`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from eagle3.planning.cost import measured_rates
from eagle3.serving.advice import step_cost_classes

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w.]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def _n(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def rates_table() -> str:
    """One row per entry of rates.yaml: the figures cost.py divides by."""
    rows = [
        "| accelerator | target measured | capture tok/s | training tok/s (precision) | regeneration tok/s |",
        "|---|---|---|---|---|",
    ]
    for r in measured_rates():
        train = "(MoE entry: capture only)" if r.moe else f"{_n(r.train_tok_s)} ({r.train_precision})"
        rows.append(f"| {r.accelerator} | {r.model} | {_n(r.capture_tok_s)} | {train} | {_n(r.regen_tok_s)} |")
    return "\n".join(rows) + "\n"


def step_costs_table() -> str:
    """c(K, load) per size class of step_costs.yaml: what the serving advice predicts with."""
    out = []
    for c in step_cost_classes():
        ks = sorted({k for by_k in c.costs.values() for k in by_k})
        out.append(f"**{c.name}** ({c.params:.3g} parameters, {c.active_params:.3g} active)\n")
        out.append("| load | " + " | ".join(f"c({k})" for k in ks) + " |")
        out.append("|---|" + "---|" * len(ks))
        for load, by_k in sorted(c.costs.items()):
            out.append(f"| {load} | " + " | ".join(f"{by_k[k]:.3g}" if k in by_k else "" for k in ks) + " |")
        out.append("")
    return "\n".join(out)


CURVE = ROOT / "docs" / "data" / "budget_curve.yaml"


def budget_curve() -> dict:
    return yaml.safe_load(CURVE.read_text())


def budget_curve_table() -> str:
    """One row per head of docs/data/budget_curve.yaml, by minutes."""
    curve = budget_curve()
    rows = [
        f"On one {curve['card']}:",
        "",
        "| minutes | held-out suite (95% interval) | machine | plan | record |",
        "|---|---|---|---|---|",
    ]
    for p in sorted(curve["points"], key=lambda p: (p["minutes"], p["acceptance"])):
        interval = f" ({p['interval'][0]:.3f}-{p['interval'][1]:.3f})" if p.get("interval") else ""
        link = f"[{p['record'].removesuffix('.md')}](records/{p['record']})"
        rows.append(
            f"| {p['minutes']:g} | **{p['acceptance']:.3f}**{interval} | {p['machine']} | {p['plan']} | {link} |"
        )
    return "\n".join(rows) + "\n"


TABLES = {"rates.yaml": rates_table, "step_costs.yaml": step_costs_table, "budget_curve.yaml": budget_curve_table}


def refresh(text: str) -> tuple[str, list[str]]:
    """``text`` with every generated block rewritten, and the names of the blocks that changed."""
    changed: list[str] = []

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise SystemExit(f"unknown generated block {name!r}: expected one of {sorted(TABLES)}")
        body = TABLES[name]()
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(one, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a block differs")
    args = parser.parse_args(argv)
    stale = []
    for doc in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]:
        new, changed = refresh(doc.read_text())
        stale += [f"{doc.relative_to(ROOT)}: {name}" for name in changed]
        if changed and not args.check:
            doc.write_text(new)
    if stale:
        print(("stale: " if args.check else "rewrote: ") + "; ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
