"""What polish.py's summary says the polish recovered: the polished head minus the start head on
the headline prompts, with the paired interval of eagle3/evaluation/gap.py where both reports
have per-prompt figures, the reason where they do not, and the refusal (not a crash) where the
two were measured on different prompts."""

from __future__ import annotations

import json
import random

from helpers.acceptance_reports import acceptance_json

from eagle3.stages.polish import _gain_line, _gap


def _measured(tmp_path, name: str, report: dict) -> dict:
    """A head's figures as polish keeps them (evaluate_trained's result through _served)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(report))
    return {"mean_acceptance_length": report["by_source"]["broad"]["mean_acceptance_length"], "json": str(path)}


def _prompts(better: int, seed: int = 0) -> dict:
    """24 broad prompts, each 20 verify steps; prompt i accepts ``better * (1 + i % 3)`` more first
    drafts (the gain differs between prompts, so the interval has a width)."""
    rng = random.Random(seed)
    prompts = {}
    for i in range(24):
        first = rng.randint(4, 12)
        prompts[("broad", f"p{i}")] = [(20, [first + better * (1 + i % 3), first // 2, first // 4])]
    return prompts


def test_a_polish_better_on_every_prompt_says_so_with_an_interval_above_zero(tmp_path):
    start = _measured(tmp_path, "start", acceptance_json(_prompts(0), headline_sets=["broad"]))
    polished = _measured(tmp_path, "polished", acceptance_json(_prompts(3), headline_sets=["broad"]))
    gap = _gap(start, polished)
    assert gap is not None and gap["prompts"] == 24
    assert abs(gap["gap"] - 6 / 20) < 1e-9  # 3, 6 or 9 more first drafts in 20 verify steps: 6 on average
    lo, hi = gap["gap_interval"]
    assert 0 < lo < gap["gap"] < hi
    summary = {"acceptance": {"start": start, "polished": polished, "gap": gap}}
    line = _gain_line(summary)
    assert "(+0.300, 95% interval" in line and "over 24 prompts)" in line


def test_without_per_prompt_figures_the_gap_has_no_interval_and_says_where_to_look(tmp_path):
    start = _measured(tmp_path, "s", acceptance_json(_prompts(0), headline_sets=["broad"], per_request=False))
    polished = _measured(tmp_path, "p", acceptance_json(_prompts(1), headline_sets=["broad"], per_request=False))
    gap = _gap(start, polished)
    assert gap["gap_interval"] is None and "eval.prompts_apart=true" in gap["no_interval_reason"]
    line = _gain_line({"acceptance": {"start": start, "polished": polished, "gap": gap}})
    assert line.endswith("no interval: see summary.json acceptance.gap)")


def test_reports_of_different_prompts_give_the_reason_not_a_crash(tmp_path):
    other = dict(list(_prompts(0).items())[:20])
    start = _measured(tmp_path, "s", acceptance_json(other, headline_sets=["broad"]))
    polished = _measured(tmp_path, "p", acceptance_json(_prompts(1), headline_sets=["broad"]))
    gap = _gap(start, polished)
    assert "not measurements of the same prompts" in gap["error"]
    assert _gap(start, None) is None and _gap({"mean_acceptance_length": 2.0}, polished) is None
