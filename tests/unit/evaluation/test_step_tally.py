"""StepTally: each request's acceptance histogram from the tokens each engine step adds to it
(eval.step_figures), checked on hand-written step sequences; the real engine's agreement with
vLLM's own per-request figures: tests/integration/vllm/test_category_counters.py."""

from __future__ import annotations

import pytest

from eagle3.evaluation.step_tally import StepTally

K = 3
EOS = 2


def _tally(*requests: str, max_tokens: int = 64) -> StepTally:
    t = StepTally(K, max_tokens, [EOS])
    for r in requests:
        t.add_request(r)
    return t


def test_the_prefill_output_is_no_verify_step_and_each_later_one_accepted_n_minus_one():
    t = _tally("a")
    assert not t.add("a", [10])  # prefill: 1 token, nothing verified
    for step in ([11], [12, 13], [14, 15, 16, 17], [18, 19, 20]):
        assert not t.add("a", step)
    assert t.histogram("a") == [1, 1, 1, 1]  # h[j]: verify steps that accepted j drafts
    assert t.tokens("a") == list(range(10, 21)) and t.finish_reason("a") is None


def test_interleaved_requests_and_empty_outputs_keep_apart():
    t = _tally("a", "b")
    t.add("a", [])  # a chunked prefill's step: no token, no verify step
    t.add("b", [5])
    t.add("a", [6])
    t.add("b", [7, 8, 9, 10])
    t.add("a", [11, 12])
    t.add("b", [])
    assert t.histogram("a") == [0, 1, 0, 0] and t.histogram("b") == [0, 0, 0, 1]


def test_a_stop_token_mid_step_ends_the_request_kept_with_the_whole_steps_acceptance():
    """vLLM counts the step's accepted drafts before it cuts the tokens after the stop token: the
    tally does the same (the engine runs with ignore_eos so the step arrives whole)."""
    t = _tally("a")
    t.add("a", [10])
    assert t.add("a", [11, EOS, 30, 31])  # accepted 3; the request ends at EOS (kept)
    assert t.histogram("a") == [0, 0, 0, 1]
    assert t.tokens("a") == [10, 11, EOS] and t.finish_reason("a") == "stop"
    assert t.add("a", [40, 41])  # an in-flight step after the end: ignored
    assert t.histogram("a") == [0, 0, 0, 1] and t.tokens("a") == [10, 11, EOS]


def test_max_tokens_cuts_the_last_step_but_counts_all_it_accepted():
    t = _tally("a", max_tokens=4)
    t.add("a", [10])
    assert not t.add("a", [11, 12])
    assert t.add("a", [13, 14, 15, 16])  # max_tokens + K asked of vLLM: the step arrives whole
    assert t.histogram("a") == [0, 1, 0, 1]
    assert t.tokens("a") == [10, 11, 12, 13] and t.finish_reason("a") == "length"


def test_a_stop_token_at_max_tokens_is_a_stop_and_the_prefill_token_can_end_it():
    t = _tally("a", "b", max_tokens=2)
    t.add("a", [10])
    assert t.add("a", [EOS, 3]) and t.finish_reason("a") == "stop"  # as vLLM's check_stop: stop first
    assert t.add("b", [EOS]) and t.finish_reason("b") == "stop" and t.histogram("b") == [0] * (K + 1)


def test_vllm_ending_a_request_itself_keeps_its_reason():
    t = _tally("a")
    t.add("a", [10])
    assert t.add("a", [11], finished=True, reason="length")  # e.g. max_model_len
    assert t.finish_reason("a") == "length" and t.ended("a") and t.histogram("a") == [1, 0, 0, 0]


def test_a_step_of_more_than_k_plus_one_tokens_is_clipped_and_told():
    t = _tally("a")
    t.add("a", [10])
    t.add("a", [1, 1, 1, 1, 1])
    assert t.histogram("a") == [0, 0, 0, 1] and t.clipped() == 1


def test_bad_arguments():
    with pytest.raises(ValueError):
        StepTally(0, 8)
    t = _tally("a")
    with pytest.raises(ValueError):
        t.add_request("a")
    with pytest.raises(KeyError):
        t.add("b", [1])
