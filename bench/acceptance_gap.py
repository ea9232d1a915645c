"""Is head B better than head A, by how much, and is it noise? Two acceptance.json reports
(evaluate.py's, one per head) measured on the same prompts, compared prompt by prompt: per set
(the headline pooled, each prompt set, the validation split) each head's mean acceptance length,
B minus A with its paired bootstrap interval (the same resampled prompts for both heads) and the
relative gap B / A - 1; a CLI over ``eagle3.evaluation.gap.acceptance_gap``.

    python bench/acceptance_gap.py runs/a/export/acceptance.json runs/b/export/acceptance.json \
        [--names A B] [--out gap.json] [--level 0.95 --n-boot 2000 --seed 0]

Reports of different prompts, K or max_new_tokens are refused (exit 2, saying what differs).
Where either report has no per-prompt figures (a vLLM without per-request figures) the table has
the point gaps from each set's counters and says why there is no interval.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

from harness import add_out, write_json

from eagle3.evaluation.gap import acceptance_gap
from eagle3.evaluation.intervals import LEVEL, N_BOOT


def _signed(x: float, digits: int = 3, unit: str = "") -> str:
    return f"{x:+.{digits}f}{unit}"


def _with_interval(x: float, interval: Optional[list[float]], digits: int = 3, percent: bool = False) -> str:
    """'+0.120 [+0.050, +0.190]' ('n/a' for a missing interval); ``percent``: x and the interval in %."""
    scale, unit = (100.0, "%") if percent else (1.0, "")
    shown = [_signed(v * scale, digits, unit) for v in [x, *(interval or [])]]
    return f"{shown[0]} [{', '.join(shown[1:]) or 'n/a'}]"


def table(gap: dict[str, Any]) -> str:
    """The gap as a markdown table, then how its intervals were made (or why there are none)."""
    na, nb = gap["names"]
    pct = f"{gap['level'] * 100:g}%"
    rows = [
        f"| set | prompts | {na} | {nb} | {nb} - {na} [{pct}] | relative [{pct}] | per position {nb} - {na} |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in gap["sets"].values():
        positions = " ".join(_signed(x) for x in s["per_position_gap"])
        rows.append(
            f"| {s['label']} | {s['prompts']} | {s['a']['mean_acceptance_length']:.3f} | "
            f"{s['b']['mean_acceptance_length']:.3f} | {_with_interval(s['gap'], s['gap_interval'])} | "
            f"{_with_interval(s['relative_gap'], s['relative_gap_interval'], 1, percent=True)} | {positions} |"
        )
    notes = [f"K={gap['num_draft_tokens']}, max_new_tokens={gap['max_new_tokens']}; {na} and {nb} on the same prompts"]
    apart = gap.get("validation_apart")
    if apart:
        own = ", ".join(f"{n} {apart[n]:.3f}" if apart.get(n) is not None else f"{n} n/a" for n in (na, nb))
        notes.append(f"validation split left out: {apart['why']} ({own})")
    ta, tb = (t or "unquantized" for t in gap.get("targets") or [None, None])
    if ta != tb:
        notes.append(
            f"the targets differ ({na} against {ta}, {nb} against {tb}): the gap is of head and target together"
        )
    elif ta != "unquantized":
        notes.append(f"both against the target served as {ta}")
    if gap["no_interval_reason"] is None:
        notes.append(f"intervals: {gap['method']}, {gap['n_boot']} resamples, seed {gap['seed']}")
        notes += [
            f"{s['label']}: no interval: {s['no_interval_reason']}"
            for s in gap["sets"].values()
            if s["no_interval_reason"]
        ]
    else:
        notes.append(f"intervals: n/a: {gap['no_interval_reason']}")
    return "\n".join(rows + [""] + notes)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("a", type=Path, help="head A's acceptance.json (the baseline)")
    ap.add_argument("b", type=Path, help="head B's acceptance.json (the one compared with A)")
    ap.add_argument(
        "--names", nargs=2, default=["A", "B"], metavar=("A", "B"), help="the heads' names in the table and JSON"
    )
    ap.add_argument("--level", type=float, default=LEVEL, help="the intervals' central share")
    ap.add_argument("--n-boot", type=int, default=N_BOOT, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=0, help="the resamples' seed")
    add_out(ap, required=False, help="JSON results path (the gap, the reports' paths)")
    args = ap.parse_args(argv)
    reports = [json.loads(p.read_text()) for p in (args.a, args.b)]
    try:
        gap = acceptance_gap(*reports, level=args.level, n_boot=args.n_boot, seed=args.seed, names=tuple(args.names))
    except ValueError as e:
        print(f"error: {e} ({args.names[0]}: {args.a}, {args.names[1]}: {args.b})", file=sys.stderr)
        return 2
    print(table(gap))
    write_json(args.out, {"reports": {args.names[0]: str(args.a), args.names[1]: str(args.b)}, **gap})
    return 0


if __name__ == "__main__":
    sys.exit(main())
