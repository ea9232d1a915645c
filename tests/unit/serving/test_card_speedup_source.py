"""The model card's figures from acceptance.json and serving.json: intervals that acceptance.json
says are n/a show as n/a with the reason; the only speed-up is the serving measurement's, with
its machine, load and K, never the evaluation engines' tok/s ratio."""

from __future__ import annotations

from eagle3.serving.advice import from_measurements
from eagle3.serving.model_card import _acceptance_section, _serving_section
from eagle3.serving.speedup_table import NATURAL_LABEL

REASON = "vLLM 0.26.0 gives no per-request spec-decode figures"


def _acceptance() -> dict:
    """acceptance.json's keys the card reads, as the report writes them without per-request figures."""
    figures = {
        "prompts": 2,
        "mean_acceptance_length": 1.875,
        "per_position_acceptance_rate": [0.5, 0.375, 0.0],
        "eval_engines_tok_s_ratio": 1.49,
    }
    return {
        "num_draft_tokens": 3,
        "max_new_tokens": 32,
        "engine": {"vllm_version": "0.26.0", "platform": "cuda"},
        "headline": {"label": "held-out suite", "sets": ["broad"], "prompts": 2},
        **figures,
        "interval_method": f"n/a: {REASON}",
        "interval": "n/a",
        "intervals": {"broad": "n/a", "held_out": "n/a"},
        "set_labels": {"broad": "broad suite (held out)"},
        "by_source": {"broad": dict(figures)},
        "by_category": {
            "writing": {"set": "broad", "prompts": 1, "mean_acceptance_length": 2.25, "interval": "n/a"},
            "math": {"set": "broad", "prompts": 1, "mean_acceptance_length": 1.5, "interval": "n/a"},
        },
        "per_prompt": [],
    }


def test_the_acceptance_section_says_n_a_and_carries_no_speed_up():
    section = _acceptance_section(_acceptance(), "/exports/e")
    assert f"Intervals: n/a: {REASON}." in section
    headline = next(line for line in section.splitlines() if line.startswith("| held-out suite"))
    writing = next(line for line in section.splitlines() if line.startswith("| writing"))
    assert "| n/a |" in headline and "| n/a |" in writing
    assert "speed-up |" not in section and "1.49" not in section


def test_the_serving_section_is_the_only_speed_up_with_its_machine_load_and_k():
    advice = from_measurements({1: {1: 1.12, 3: 1.22}, 8: {3: 0.9}}, device="one H200", speedups_from=NATURAL_LABEL)
    section = _serving_section(advice, "/exports/e")
    assert f"on one H200, {NATURAL_LABEL} (`serving.json`)" in section
    assert "| load | K | speed-up |" in section and "| 1 | 3 | 1.22x |" in section and "| 8 | none | 1.00x |" in section
    assert "1.49" not in section
