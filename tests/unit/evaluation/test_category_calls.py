"""A prompt set run one category at a time (where vLLM gives no per-request figures) and put back
together as the set: prompts split by category, results merged back in prompt order with the
second turns renumbered, counters summed and kept per category; and the route's decision."""

from __future__ import annotations

import pytest

from eagle3.evaluation.breakdown import FROM_COUNTERS, counter_breakdown
from eagle3.evaluation.category_calls import category_calls, merge_category_results
from eagle3.evaluation.counters import SpecDecodeCounters
from eagle3.evaluation.engine import use_per_request
from eagle3.evaluation.engine_io import BatchResult, PromptBatch
from eagle3.evaluation.figures import prompt_outcomes

K = 3
SECOND = {"messages": [{"role": "user", "content": "q"}], "question": "and?"}


def _suite_batch() -> PromptBatch:
    # stratified as the suite is: writing, math, then writing again (with a second turn)
    return PromptBatch(
        "broad",
        [[1], [2], [3]],
        second_turns=[None, None, SECOND],
        categories=["writing", "math", "writing"],
    )


def test_each_category_is_a_call_of_its_own_with_its_second_turns():
    calls = category_calls(_suite_batch())
    assert [(c.category, c.rows, c.batch.prompts) for c in calls] == [
        ("writing", [0, 2], [[1], [3]]),
        ("math", [1], [[2]]),
    ]
    assert calls[0].batch.second_turns == [None, SECOND] and calls[1].batch.second_turns is None
    assert all(c.batch.name == "broad" for c in calls)
    # a set without categories is one call, named as the set
    (one,) = category_calls(PromptBatch("val", [[4], [5]]))
    assert (one.category, one.rows) == ("val", [0, 1])


def test_a_categories_list_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match=r"'broad': categories: expected one per prompt \(3\), got 2"):
        category_calls(PromptBatch("broad", [[1], [2], [3]], categories=["a", "b"]))


def _merged() -> BatchResult:
    calls = category_calls(_suite_batch())
    writing = BatchResult(
        "broad", [[10, 11], [30], [31, 32, 33]], 2.0, SpecDecodeCounters(5, 15, 3, [2, 1, 0]).to_dict(),
        [[], [], []], followups=[{"of": 1, "prompt_tokens": 40}], finish_reasons=["stop", "length", "stop"],
        preemptions=0,
    )  # fmt: skip
    math_ = BatchResult(
        "broad", [[20]], 1.0, SpecDecodeCounters(2, 6, 1, [1, 0, 0]).to_dict(), [[]],
        finish_reasons=["length"], preemptions=1,
    )  # fmt: skip
    return merge_category_results("broad", 3, [(calls[0], writing), (calls[1], math_)])


def test_the_categories_results_merge_back_as_the_sets():
    merged = _merged()
    # first turns in prompt order, then the second turn, numbered by its first turn in the set
    assert merged.outputs == [[10, 11], [20], [30], [31, 32, 33]]
    assert merged.finish_reasons == ["stop", "length", "length", "stop"]
    assert merged.followups == [{"of": 2, "prompt_tokens": 40}]
    assert (merged.seconds, merged.preemptions) == (3.0, 1)
    # the set's counters are the sum of its categories', each category's kept
    assert merged.counters == SpecDecodeCounters(7, 21, 4, [3, 1, 0]).to_dict()
    assert set(merged.category_counters or {}) == {"writing", "math"}
    assert merged.category_counters["math"]["drafts"] == 2
    # the per-request outcomes line up with the set's prompts as they do for one call
    rows = prompt_outcomes(
        merged, None, ["writing-01", "math-01", "writing-02"], [5, 6, 7], ["writing", "math", "writing"]
    )
    assert [(r.id, r.category, r.output_tokens) for r in rows] == [
        ("writing-01", "writing", 2),
        ("math-01", "math", 1),
        ("writing-02", "writing", 1),
        ("writing-02#2", "writing", 3),
    ]


def test_the_engine_without_a_head_merges_with_no_counters():
    calls = category_calls(_suite_batch())
    parts = [(c, BatchResult("broad", [[0]] * len(c.rows) + [[9]] * bool(c.batch.second_turns), 1.0)) for c in calls]
    parts[0][1].followups = [{"of": 1, "prompt_tokens": 40}]
    merged = merge_category_results("broad", 3, parts)
    assert merged.counters is None and merged.category_counters is None and merged.histograms is None
    assert merged.outputs == [[0], [0], [0], [9]]


def test_per_category_figures_come_from_each_categorys_counters():
    merged = _merged()
    cats, intervals = counter_breakdown([merged], {"broad": ["writing", "math", "writing"]}, K, ["broad"])
    assert cats["writing"]["prompts"] == 2 and cats["math"]["prompts"] == 1  # a second turn counts once
    assert cats["writing"]["mean_acceptance_length"] == pytest.approx(1 + 3 / 5)
    assert cats["writing"]["per_position_acceptance_rate"] == pytest.approx([2 / 5, 1 / 5, 0])
    assert (cats["math"]["drafts"], cats["math"]["accepted_per_position"]) == (2, [1, 0, 0])
    assert {c["figures_from"] for c in cats.values()} == {FROM_COUNTERS}
    assert all(c["interval"] is None for c in cats.values())
    assert intervals == {"broad": None, "held_out": None}


def test_the_per_request_route_is_what_vllm_offers_unless_the_request_says():
    assert use_per_request(None, True, "0.32.0") is True
    assert use_per_request(None, False, "0.26.0") is False
    assert use_per_request(False, True, "0.32.0") is False  # a test forces the counters-only route
    with pytest.raises(ValueError, match="vLLM 0.26.0 has no per_request_spec_decode_metrics"):
        use_per_request(True, False, "0.26.0")
