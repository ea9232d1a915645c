"""Confidence intervals of acceptance, from vLLM's per-request spec-decode figures.

A prompt set's acceptance length is pooled: 1 + accepted / verify steps, summed over its
requests (what vLLM's engine counters give). Prompts differ far more than the steps within one
answer, so the interval resamples prompts (a two-turn prompt's turns stay together: one unit):
``n_boot`` bootstrap sets of as many prompts, drawn with replacement, each pooled the same way;
the interval is their central ``level`` share. Per draft position the same resamples give an
interval of each rate; ``per_position_lower`` (each position's lower end) is what the serving
advice predicts from (eagle3/serving/advice.py): summed, it is never above the lower end of the
tokens per step it implies, so a prediction made from it errs towards "the head does not pay".

Without per-request figures (a vLLM release that does not give them: CUDA vLLM 0.26) there is
no interval: the engine counters give each category's totals (eagle3/evaluation/category_calls.py),
not each prompt's, and resampling the eight categories of a set would treat strata chosen by
design as a random sample. The report says "n/a" there, with that reason (report.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import numpy as np

LEVEL = 0.95
N_BOOT = 2000
METHOD = "bootstrap over prompts (percentile), pooled 1 + accepted / verify steps"


@dataclass(frozen=True)
class Unit:
    """One prompt's verify steps and accepted drafts per position (its turns summed)."""

    drafts: int
    accepted_per_position: tuple[int, ...]


PromptKey = tuple[str, str]  # (set, prompt id without its "#<turn>" suffix): one prompt unit


def prompt_key(source: str, request_id: str) -> PromptKey:
    """The prompt unit a request belongs to: a second turn's id is its first turn's + "#2"."""
    return str(source), str(request_id).split("#")[0]


def prompt_units(
    turns: Iterable[tuple[PromptKey, Optional[int], Optional[Sequence[int]]]], k: int
) -> dict[PromptKey, Unit]:
    """Each prompt's unit from its requests' (key, verify steps, accepted per position), its
    turns summed; positions past a request's list count 0. Keys in order of first appearance."""
    drafts: dict[PromptKey, int] = {}
    accepted: dict[PromptKey, list[int]] = {}
    for key, steps, per_pos in turns:
        row = list(per_pos or [])[:k]
        drafts[key] = drafts.get(key, 0) + int(steps or 0)
        accepted[key] = [a + int(b) for a, b in zip(accepted.get(key, [0] * k), row + [0] * (k - len(row)))]
    return {key: Unit(drafts[key], tuple(accepted[key])) for key in drafts}


def unit_of_histograms(histograms: Sequence[Sequence[int]], k: int) -> Unit:
    """A prompt's unit from vLLM's per-request histograms (h[j]: verify steps that accepted j drafts)."""
    drafts, per_pos = 0, [0] * k
    for h in histograms:
        for j, steps in enumerate(h):
            drafts += int(steps)
            for pos in range(min(j, k)):
                per_pos[pos] += int(steps)
    return Unit(drafts, tuple(per_pos))


def pooled(units: Sequence[Unit], k: int) -> tuple[float, list[float]]:
    """(acceptance length, per-position rates) of the units pooled."""
    drafts = sum(u.drafts for u in units)
    if not drafts:
        return math.nan, [math.nan] * k
    rates = [sum(u.accepted_per_position[i] for u in units) / drafts for i in range(k)]
    return 1.0 + sum(rates), rates


def bootstrap(
    units: Sequence[Unit], k: int, level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0
) -> Optional[dict[str, Any]]:
    """The interval of a set's acceptance length and per-position rates; None under 2 prompts
    with drafts (one prompt has no spread to resample)."""
    units = [u for u in units if u.drafts]
    if len(units) < 2:
        return None
    drafts = np.array([u.drafts for u in units], dtype=np.float64)
    accepted = np.array([u.accepted_per_position[:k] for u in units], dtype=np.float64).reshape(len(units), k)
    picks = np.random.default_rng(seed).integers(0, len(units), size=(n_boot, len(units)))
    rates = accepted[picks].sum(axis=1) / drafts[picks].sum(axis=1)[:, None]  # [n_boot, k]
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(rates, [tail, 100 - tail], axis=0)
    length = np.percentile(1.0 + rates.sum(axis=1), [tail, 100 - tail])
    return {
        "level": level,
        "method": METHOD,
        "prompts": len(units),
        "mean_acceptance_length": [round(float(length[0]), 4), round(float(length[1]), 4)],
        "per_position_acceptance_rate": [[round(float(a), 4), round(float(b), 4)] for a, b in zip(lo, hi)],
        "per_position_lower": [round(float(a), 4) for a in lo],
    }


def set_figures(units: Sequence[Unit], k: int) -> dict[str, Any]:
    """A category's or set's figures from its prompts' units: point values and interval."""
    length, rates = pooled(units, k)
    return {
        "prompts": len(units),
        "mean_acceptance_length": length,
        "per_position_acceptance_rate": rates,
        "drafts": sum(u.drafts for u in units),
        "accepted_per_position": [sum(u.accepted_per_position[i] for u in units) for i in range(k)],
        "interval": bootstrap(units, k),
    }
