"""Without vLLM's per-request figures there is no interval, and the report says "n/a" with the
reason in acceptance.json and the printed table (never a blank); the evaluation engines' tok/s
ratio goes by a name that says it is not a serving figure."""

from __future__ import annotations

import json

from rich.console import Console

from eagle3.evaluation.breakdown import counter_breakdown
from eagle3.evaluation.counters import SpecDecodeCounters
from eagle3.evaluation.engine_io import BatchResult
from eagle3.evaluation.figures import figures_of, prompt_outcomes
from eagle3.evaluation.report import AcceptanceReport, print_table, write_json

K = 3
REASON = "vLLM 0.26.0 gives no per-request spec-decode figures"


def _report(reason: str | None) -> AcceptanceReport:
    with_head = BatchResult(
        "broad", [[1] * 8, [2] * 8], 2.0, SpecDecodeCounters(8, 24, 7, [4, 3, 0]).to_dict(),
        [[], []], category_counters={
            "writing": SpecDecodeCounters(4, 12, 5, [3, 2, 0]).to_dict(),
            "math": SpecDecodeCounters(4, 12, 2, [1, 1, 0]).to_dict(),
        },
    )  # fmt: skip
    without = BatchResult("broad", [[1] * 8, [2] * 8], 3.0)
    fig = figures_of([with_head], [without], K)
    report = AcceptanceReport(
        "/exports/e", "/targets/t", K, 32, fig, {"broad": fig}, {"broad": 2},
        per_prompt=prompt_outcomes(with_head, without, ["writing-01", "math-01"], [5, 5], ["writing", "math"]),
        engine={"vllm_version": "0.26.0", "platform": "cuda", "enforce_eager": True, "max_num_seqs": 16},
        headline_sets=["broad"],
    )  # fmt: skip
    report.by_category, report.intervals = counter_breakdown([with_head], {"broad": ["writing", "math"]}, K, ["broad"])
    report.no_interval_reason = reason
    return report


def test_acceptance_json_says_n_a_with_the_reason_where_there_are_no_intervals(tmp_path):
    data = json.loads(write_json(_report(REASON), tmp_path).read_text())
    assert data["interval_method"] == f"n/a: {REASON}"
    assert data["interval"] == "n/a" and data["intervals"] == {"broad": "n/a", "held_out": "n/a"}
    assert {name: c["interval"] for name, c in data["by_category"].items()} == {"writing": "n/a", "math": "n/a"}
    assert data["by_category"]["writing"]["mean_acceptance_length"] == 1 + 5 / 4
    assert data["per_position_acceptance_rate_lower"] is None
    # the engines' ratio, named for what it is, and no "speedup" key to read as serving's
    assert data["eval_engines_tok_s_ratio"] == 1.5 and "speedup" not in data
    assert (
        "not a serving figure" in data["eval_engines_tok_s_ratio_is"] and "eager" in data["eval_engines_tok_s_ratio_is"]
    )
    # with intervals, the method is the bootstrap's and a missing one stays null (under two prompts)
    data = json.loads(write_json(_report(None), tmp_path).read_text())
    assert data["interval_method"].startswith("bootstrap over prompts") and data["interval"] is None


def test_the_printed_table_says_n_a_and_why(capsys):
    print_table(_report(REASON), Console(width=240, file=None))
    out = capsys.readouterr().out
    assert f"95% intervals n/a: {REASON}" in out
    headline = next(line for line in out.splitlines() if "held-out suite" in line)
    assert "n/a" in headline
    assert any("writing" in line and "n/a" in line for line in out.splitlines())  # the category table
    assert "speedup" not in out and "not a serving figure" in out
