"""The held-out suite (eagle3/evaluation/suite.py): its files, the stratified pick, the bootstrap
intervals over prompts, acceptance.json's new fields. That it never reaches training:
integration/test_broad_suite_data.py; the suite path through a real vLLM engine:
integration/vllm/test_broad_suite_vllm.py."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import pytest

from eagle3.config.choices import Quantization
from eagle3.config.engine import EngineOptions
from eagle3.evaluation.acceptance_run import _engine_facts, breakdown
from eagle3.evaluation.counters import SpecDecodeCounters
from eagle3.evaluation.engine_io import BatchResult
from eagle3.evaluation.figures import PromptOutcome, figures_of, prompt_outcomes
from eagle3.evaluation.intervals import Unit, bootstrap, pooled, unit_of_histograms
from eagle3.evaluation.report import AcceptanceReport, print_table, write_json
from eagle3.evaluation.suite import CATEGORIES, read_suite, stratified, suite_prompts

K = 3


def test_the_suite_has_twelve_prompts_per_category_and_second_turns():
    broad = read_suite("broad")
    by_cat: dict[str, list] = {}
    for p in broad:
        by_cat.setdefault(p.category, []).append(p)
    assert tuple(by_cat) == CATEGORIES and all(len(v) == 12 for v in by_cat.values())
    assert all(sum(len(p.turns) == 2 for p in v) >= 2 for v in by_cat.values())
    math_word = read_suite("math_word")
    assert len(math_word) >= 24 and {p.category for p in math_word} == {"math_word"}
    assert len({p.id for p in broad + math_word}) == len(broad) + len(math_word)
    lengths = [len(p.turns[0].split()) for p in broad]  # everyday traffic: short asks and long ones
    assert min(lengths) < 8 and max(lengths) > 30


def test_a_run_takes_the_suite_stratified_by_category():
    first8 = suite_prompts("broad", 8)
    assert [p.category for p in first8] == list(CATEGORIES)
    nine = suite_prompts("broad", 9)
    assert nine[8].id == "writing-02" and len(nine[8].turns) == 2  # the second round starts a second turn
    assert len(suite_prompts("broad", 500)) == 96 and suite_prompts("math_word", 0) == []
    assert [p.category for p in stratified(read_suite("broad")[:14], 4)] == [
        "writing",
        "roleplay",
        "writing",
        "roleplay",
    ]


def test_a_malformed_suite_record_is_named(tmp_path, monkeypatch):
    from eagle3.evaluation import suite

    bad = tmp_path / "broad.jsonl"
    bad.write_text('{"id": "a", "category": "writing", "turns": ["x"]}\n{"id": "b", "category": "math", "turns": []}\n')
    monkeypatch.setitem(suite.SUITE_FILES, "broad", bad)
    with pytest.raises(
        suite.SuiteError, match=re.escape(f"{bad} line 2: turns: expected 1 or 2 non-empty strings, got []")
    ):
        read_suite("broad")


# ------------------------------------------------------------------ intervals


def test_bootstrap_interval_brackets_the_pooled_figure():
    units = [Unit(10, (8, 6, 4)), Unit(10, (2, 1, 0)), Unit(20, (10, 5, 2)), Unit(5, (5, 5, 5))]
    length, rates = pooled(units, K)
    assert length == pytest.approx(1 + (25 + 17 + 11) / 45)
    got = bootstrap(units, K)
    assert got is not None and got["prompts"] == 4 and got["level"] == 0.95
    lo, hi = got["mean_acceptance_length"]
    assert lo < length < hi and 1.0 <= lo and hi <= 1 + K
    for (a, b), r, low in zip(got["per_position_acceptance_rate"], rates, got["per_position_lower"]):
        assert a <= r <= b and low == a
    assert bootstrap(units, K) == got  # seeded: the same figures every run
    # identical prompts: no spread, the interval is the point
    same = bootstrap([Unit(10, (5, 3, 1))] * 6, K)
    assert same is not None and same["mean_acceptance_length"] == [pytest.approx(1.9)] * 2
    # one prompt (or none with drafts) has nothing to resample
    assert bootstrap([Unit(10, (5, 3, 1)), Unit(0, (0, 0, 0))], K) is None


def test_a_wider_spread_of_prompts_gives_a_wider_interval():
    narrow = [Unit(10, (6, 4, 2)), Unit(10, (5, 3, 2))] * 10
    wide = [Unit(10, (10, 9, 8)), Unit(10, (1, 0, 0))] * 10
    width = lambda u: (lambda i: i[1] - i[0])(bootstrap(u, K)["mean_acceptance_length"])  # noqa: E731
    assert width(wide) > 3 * width(narrow)


def test_histograms_give_a_prompts_unit():
    assert unit_of_histograms([[2, 1, 0, 1], [0, 0, 2, 0]], K) == Unit(6, (4, 3, 1))


def _outcome(source, pid, category, drafts, per_pos, turn=1):
    return PromptOutcome(source, pid, 10, 20, math.nan, None, None, category, turn, drafts, list(per_pos))


def test_breakdown_per_category_and_set_keeps_a_prompts_turns_together():
    rows = [
        _outcome("broad", "writing-01", "writing", 10, (8, 6, 4)),
        _outcome("broad", "writing-02", "writing", 10, (2, 1, 0)),
        _outcome("broad", "writing-02#2", "writing", 10, (4, 2, 0), turn=2),
        _outcome("broad", "math-01", "math", 10, (9, 8, 7)),
        _outcome("humaneval", "HumanEval/0", "humaneval", 10, (5, 5, 5)),
        _outcome("val", "c1", "val", 10, (9, 9, 9)),
        _outcome("val", "c3", "val", 10, (8, 8, 8)),
    ]
    cats, intervals = breakdown(rows, K, ["broad", "humaneval"])
    assert set(cats) == {"writing", "math", "humaneval", "val"}
    assert cats["writing"]["prompts"] == 2 and cats["writing"]["set"] == "broad"  # writing-02's two turns: one unit
    assert cats["writing"]["mean_acceptance_length"] == pytest.approx(1 + 27 / 30)
    assert cats["math"]["interval"] is None  # one prompt
    assert set(intervals) == {"broad", "humaneval", "val", "held_out"}
    assert intervals["held_out"]["prompts"] == 4 and intervals["val"]["prompts"] == 2


def test_prompt_outcomes_name_second_turns_after_the_first():
    hists = [[1, 1, 0, 0], [0, 0, 0, 2], [2, 0, 0, 0]]
    batch = BatchResult(
        "broad", [[1, 2], [3, 4, 5], [6]], 1.0, SpecDecodeCounters(6, 18, 7, [3, 2, 2]).to_dict(), hists,
        followups=[{"of": 0, "prompt_tokens": 40}],
    )  # fmt: skip
    got = prompt_outcomes(batch, None, ["writing-02", "math-01"], [12, 9], ["writing", "math"])
    assert [(p.id, p.turn, p.category, p.prompt_tokens) for p in got] == [
        ("writing-02", 1, "writing", 12),
        ("math-01", 1, "math", 9),
        ("writing-02#2", 2, "writing", 40),
    ]
    assert (got[1].drafts, got[1].accepted_per_position) == (2, [2, 2, 2])


def test_acceptance_json_holds_the_headline_its_interval_and_the_in_distribution_figure(tmp_path, capsys):
    """acceptance.json: the top level is the held-out suite (existing keys kept), its interval and
    lower per-position rates beside it; the validation split is labelled in-distribution."""
    from rich.console import Console

    def batch(name, counters, hists):
        return BatchResult(name, [[1] * 8 for _ in hists], 1.0, SpecDecodeCounters(*counters).to_dict(), hists)

    broad = batch("broad", (8, 24, 7, [4, 3, 0]), [[2, 1, 1, 0], [2, 0, 2, 0]])
    val = batch("val", (4, 12, 8, [4, 3, 1]), [[0, 1, 1, 0], [0, 0, 1, 1]])
    per_prompt = prompt_outcomes(broad, None, ["writing-01", "math-01"], [5, 5], ["writing", "math"])
    per_prompt += prompt_outcomes(val, None, ["c1", "c3"], [5, 5])
    report = AcceptanceReport(
        "e", "t", K, 32, figures_of([broad], None, K), {"broad": figures_of([broad], None, K), "val": figures_of([val], None, K)},
        {"broad": 2, "val": 2}, per_prompt=per_prompt, headline_sets=["broad"],
    )  # fmt: skip
    report.by_category, report.intervals = breakdown(per_prompt, K, ["broad"])
    data = json.loads(write_json(report, tmp_path).read_text())
    assert data["mean_acceptance_length"] == pytest.approx(1 + 7 / 8) and data["headline"]["label"] == "held-out suite"
    assert data["ends"].startswith("natural EOS")
    assert data["interval"] == report.intervals["held_out"] and data["interval"]["prompts"] == 2
    assert data["per_position_acceptance_rate_lower"] == data["interval"]["per_position_lower"]
    assert data["in_distribution"]["label"] == "validation split (in-distribution)"
    assert data["in_distribution"]["mean_acceptance_length"] == pytest.approx(3.0)
    assert data["set_labels"]["val"] == "validation split (in-distribution)"
    assert set(data["by_category"]) == {"writing", "math", "val"}
    print_table(report, Console(width=200, record=True, file=None))
    err = capsys.readouterr().out
    assert "held-out suite" in err and "validation split (in-distribution)" in err and "per category" in err
    assert "served as" not in err  # the checkpoint as it is: nothing to say
    # the engines' facts name the served target's quantization, and the table says it
    ran = SimpleNamespace(
        vllm_version="0.26.0", platform="cuda", enforce_eager=True, load_seconds=1.0, together_counters=None,
        per_request=True, batches=[], prompts_apart=False, step_figures=True,
    )  # fmt: skip
    report.engine = _engine_facts(EngineOptions(quantization=Quantization.fp8), 256, tmp_path, (ran, 2.0), (None, None))
    assert report.engine["quantization"] == "fp8"
    assert _engine_facts(EngineOptions(), 256, tmp_path, (ran, 2.0), (None, None))["quantization"] is None
    print_table(report, Console(width=200, record=True, file=None))
    assert "against the target served as fp8" in capsys.readouterr().out


# ------------------------------------------------------------------ real vLLM


def test_sets_run_in_one_call_are_split_back_per_set():
    """Plain batches run as one generate() call (one answer's steps, not one per set) and come
    back per set: outputs, histograms, second turns renumbered, counters rebuilt from histograms,
    seconds shared by tokens."""
    from eagle3.evaluation.engine_io import PromptBatch, merge_batches, split_batch

    second = {"messages": [{"role": "user", "content": "q"}], "question": "and?"}
    sets = [PromptBatch("broad", [[1], [2]], second_turns=[None, second]), PromptBatch("val", [[3]])]
    merged = merge_batches(sets)
    assert merged.prompts == [[1], [2], [3]] and merged.second_turns == [None, second, None]
    hists = [[1, 1, 0, 0], [0, 0, 0, 2], [2, 0, 0, 0], [0, 1, 0, 0]]  # the three first turns, then broad's second
    whole = BatchResult(
        "together", [[5] * 4, [6] * 2, [7] * 4, [8] * 2], 6.0, SpecDecodeCounters(7, 21, 8, [4, 2, 2]).to_dict(),
        hists, preemptions=0, followups=[{"of": 1, "prompt_tokens": 30}], finish_reasons=["stop", "length", "stop", "stop"],
    )  # fmt: skip
    broad, val = split_batch(whole, sets, K)
    assert broad.outputs == [[5] * 4, [6] * 2, [8] * 2] and val.outputs == [[7] * 4]
    assert broad.followups == [{"of": 1, "prompt_tokens": 30}] and val.followups is None
    assert broad.histograms == [hists[0], hists[1], hists[3]] and broad.finish_reasons == ["stop", "length", "stop"]
    assert broad.counters == {"drafts": 5, "draft_tokens": 15, "accepted_tokens": 8, "accepted_per_position": [4, 2, 2]}
    assert val.counters["drafts"] == 2 and val.counters["accepted_tokens"] == 0
    assert (broad.seconds, val.seconds) == (pytest.approx(6.0 * 8 / 12), pytest.approx(6.0 * 4 / 12))
