"""eval.prompts_apart, where vLLM gives no per-request figures: each prompt runs as a generate()
call of its own, so a counter difference around one of its turns is that one request's figures.
The counters -> histogram conversion (the inverse of counters_from_histograms for one request),
the one-prompt calls merged back into the set's result (first turns in prompt order, then the
second turns; counters summed), and the per-request route downstream: consistency check, bootstrap
intervals and the report's interval method. No vLLM (the real engine: tests/integration/vllm)."""

from __future__ import annotations

import json
import random

import pytest

from eagle3.config.engine import EngineOptions
from eagle3.evaluation.acceptance_run import _add_breakdown, _engine_facts
from eagle3.evaluation.category_calls import merge_category_results, prompt_calls
from eagle3.evaluation.counters import (
    CounterError,
    SpecDecodeCounters,
    counters_from_histograms,
    histogram_from_counters,
)
from eagle3.evaluation.engine_io import BatchResult, EngineResult, PromptBatch
from eagle3.evaluation.figures import consistency_problems, figures_of, prompt_outcomes
from eagle3.evaluation.report import AcceptanceReport, write_json

K = 3
SECOND = {"messages": [{"role": "user", "content": "q"}], "question": "and?"}


def test_one_requests_counters_give_its_histogram_by_hand():
    # 10 verify steps: 4 accepted none, 3 accepted one, 2 accepted two, 1 accepted all three
    counters = SpecDecodeCounters(drafts=10, draft_tokens=30, accepted_tokens=10, accepted_per_position=[6, 3, 1])
    assert histogram_from_counters(counters, K) == [4, 3, 2, 1]
    # positions vLLM never registered (no step accepted that far) count as zero
    assert histogram_from_counters(SpecDecodeCounters(5, 15, 2, [2]), K) == [3, 2, 0, 0]
    assert histogram_from_counters(SpecDecodeCounters(), K) == [0, 0, 0, 0]


def test_counters_and_histograms_round_trip():
    rng = random.Random(0)
    for _ in range(200):
        h = [rng.randrange(6) for _ in range(K + 1)]
        counters = counters_from_histograms([h], K)
        assert histogram_from_counters(counters, K) == h
        assert counters_from_histograms([histogram_from_counters(counters, K)], K) == counters


def test_counters_that_are_no_one_requests_are_refused():
    with pytest.raises(CounterError, match="one request's acceptance histogram"):
        histogram_from_counters(SpecDecodeCounters(3, 9, 4, [1, 3, 0]), K)  # increases with position
    with pytest.raises(CounterError, match="one request's acceptance histogram"):
        histogram_from_counters(SpecDecodeCounters(2, 6, 3, [3, 0, 0]), K)  # more accepted than steps
    with pytest.raises(CounterError, match="more than K=3 positions"):
        histogram_from_counters(SpecDecodeCounters(4, 12, 4, [1, 1, 1, 1]), K)


# per request (prompt order, then the second turn of prompt 1): what vLLM 0.32 would have given
FIRST = [[4, 3, 2, 1], [1, 0, 5, 2], [6, 1, 0, 0]]
SECOND_TURN = [2, 2, 1, 3]
CATEGORIES = ["writing", "math", "writing"]


def _batch() -> PromptBatch:
    return PromptBatch("broad", [[1], [2], [3]], second_turns=[None, SECOND, None], categories=CATEGORIES)


def _call_result(i: int) -> BatchResult:
    """What the engine returns for prompt i's call: each turn's histogram from its own counter
    difference, the call's counters their sum (vLLM 0.26: no histogram of its own)."""
    turns = [FIRST[i]] + ([SECOND_TURN] if i == 1 else [])
    counters = [counters_from_histograms([h], K) for h in turns]
    for c in counters:
        c.draft_tokens = K * c.drafts
    total = sum(counters, SpecDecodeCounters())
    outputs = [[10 + i] * sum(h) for h in turns]
    return BatchResult(
        "broad", outputs, 1.0 + i, total.to_dict(), [histogram_from_counters(c, K) for c in counters],
        followups=[{"of": 0, "prompt_tokens": 40}] if i == 1 else None,
        finish_reasons=["stop"] * len(turns), preemptions=0,
    )  # fmt: skip


def _merged() -> BatchResult:
    calls = prompt_calls(_batch())
    return merge_category_results("broad", 3, [(c, _call_result(c.rows[0])) for c in calls])


def test_each_prompt_is_a_call_of_its_own_with_its_second_turn():
    calls = prompt_calls(_batch())
    assert [(c.category, c.rows, c.batch.prompts) for c in calls] == [
        ("writing", [0], [[1]]),
        ("math", [1], [[2]]),
        ("writing", [2], [[3]]),
    ]
    assert [c.batch.second_turns for c in calls] == [None, [SECOND], None]
    assert [c.category for c in prompt_calls(PromptBatch("val", [[4], [5]]))] == ["val", "val"]


def test_one_prompt_calls_merge_into_the_sets_result_with_a_histogram_per_request():
    merged = _merged()
    # first turns in prompt order, then the second turn (numbered by its first turn in the set)
    assert merged.histograms == [*FIRST, SECOND_TURN]
    assert merged.outputs == [[10] * 10, [11] * 8, [12] * 7, [11] * 8]
    assert merged.followups == [{"of": 1, "prompt_tokens": 40}]
    assert (merged.seconds, merged.preemptions) == (6.0, 0)
    # the set's counters are the sum of the calls', a category's the sum of its prompts' calls
    want = counters_from_histograms([*FIRST, SECOND_TURN], K)
    want.draft_tokens = K * want.drafts
    assert merged.counters == want.to_dict()
    writing = counters_from_histograms([FIRST[0], FIRST[2]], K)
    assert merged.category_counters is not None
    assert merged.category_counters["writing"]["accepted_per_position"] == writing.accepted_per_position
    assert merged.category_counters["writing"]["drafts"] == writing.drafts == 17
    # the figures check: the histograms rebuilt are the batch's counters
    assert consistency_problems(merged, K) == []


def _report(merged: BatchResult) -> AcceptanceReport:
    fig = figures_of([merged], None, K)
    ids = ["writing-01", "math-01", "writing-02"]
    return AcceptanceReport(
        "/exports/e", "/targets/t", K, 32, fig, {"broad": fig}, {"broad": 3},
        per_prompt=prompt_outcomes(merged, None, ids, [5, 5, 5], CATEGORIES), headline_sets=["broad"],
    )  # fmt: skip


def test_the_per_request_route_downstream_gives_intervals_and_says_where_the_figures_come_from(tmp_path):
    merged = _merged()
    result = EngineResult("0.26.0", "cuda", False, 1.0, 1.0, [merged], per_request=True, prompts_apart=True)
    report = _report(merged)
    assert [(p.id, p.drafts, p.accepted_per_position) for p in report.per_prompt] == [
        ("writing-01", 10, [6, 3, 1]),
        ("math-01", 8, [7, 7, 2]),
        ("writing-02", 7, [1, 0, 0]),
        ("math-01#2", 8, [6, 4, 3]),
    ]
    _add_breakdown(report, None, result, K)
    report.engine = _engine_facts(EngineOptions(max_num_seqs=1), 256, tmp_path, (result, 5.0), (None, None))
    assert report.engine["prompts_run_apart"] and report.engine["per_request_figures"]
    assert not report.engine["categories_run_apart"]
    data = json.loads(write_json(report, tmp_path).read_text())
    assert data["interval_method"].startswith("bootstrap over prompts")
    assert "counters read around that call" in data["interval_method"] and "0.26.0" in data["interval_method"]
    assert data["interval"]["mean_acceptance_length"][0] <= data["mean_acceptance_length"]
    assert data["by_category"]["writing"]["interval"] is not None  # two prompts: a spread to resample
    assert data["engine"]["prompts_run_apart"] is True


def test_step_figures_downstream_say_their_figures_come_from_each_engine_step(tmp_path):
    """eval.step_figures (eagle3/evaluation/step_tally.py) feeds the same per-request route."""
    merged = _merged()
    result = EngineResult("0.26.0", "cuda", False, 1.0, 1.0, [merged], per_request=True, step_figures=True)
    report = _report(merged)
    _add_breakdown(report, None, result, K)
    report.engine = _engine_facts(EngineOptions(max_num_seqs=1), 256, tmp_path, (result, 5.0), (None, None))
    assert report.engine["figures_from_steps"] and not report.engine["prompts_run_apart"]
    data = json.loads(write_json(report, tmp_path).read_text())
    assert data["interval_method"].startswith("bootstrap over prompts") and "0.26.0" in data["interval_method"]
    assert "rebuilt from the tokens each engine step added" in data["interval_method"]
    assert data["by_category"]["writing"]["interval"] is not None
