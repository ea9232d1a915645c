"""Figures of one prompt set (a source, or all of them): acceptance from vLLM's counters,
tokens/s with and without the head, and whether greedy outputs agree.

Inputs are the engines' per-batch results (one batch per prompt source, same prompts in the
same order in both engines), so every figure is computed once, here, for each source and
for the union.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from eagle3.evaluation.counters import SpecDecodeCounters, acceptance_length_of_histogram, counters_from_histograms
from eagle3.evaluation.engine_io import BatchResult
from eagle3.evaluation.intervals import unit_of_histograms


@dataclass
class Figures:
    prompts: int
    num_draft_tokens: int
    mean_acceptance_length: float
    acceptance_rate: float  # accepted / proposed draft tokens
    per_position_acceptance_rate: list[float]  # [K]
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int]
    generated_tokens_with_head: int
    seconds_with_head: float
    tokens_per_s_with_head: float
    generated_tokens_without_head: Optional[int] = None
    seconds_without_head: Optional[float] = None
    tokens_per_s_without_head: Optional[float] = None
    # tokens/s with the head / without, in the evaluation's own two engines (eager on a CPU, its
    # prompts as it runs them): not a serving figure, which the serving measurement gives
    # (eagle3/serving/speedup.py, serving.json)
    eval_engines_tok_s_ratio: Optional[float] = None
    greedy_matches: Optional[int] = None  # prompts whose output is identical with and without the head
    greedy_match_rate: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PromptOutcome:
    source: str
    id: str
    prompt_tokens: int
    output_tokens: int
    acceptance_length: float  # from vLLM's per-request histogram
    greedy_match: Optional[bool]
    first_difference: Optional[int]  # first output position where the two engines differ
    category: str = ""  # the suite's category (the source for the other sets)
    turn: int = 1  # 2: the second user turn, after the target's own answer to the first
    drafts: int = 0  # verify steps with drafts (per-request histogram; 0 where vLLM gives none)
    accepted_per_position: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None  # "stop": the answer ended at EOS; "length": at max_new_tokens


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else math.nan


def first_difference(a: list[int], b: list[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def figures_of(with_head: list[BatchResult], without_head: list[BatchResult] | None, num_draft_tokens: int) -> Figures:
    counters = SpecDecodeCounters(accepted_per_position=[0] * num_draft_tokens)
    for b in with_head:
        if b.counters is not None:
            counters = counters + SpecDecodeCounters.from_dict(b.counters)
    gen = sum(b.generated_tokens for b in with_head)
    secs = sum(b.seconds for b in with_head)
    fig = Figures(
        prompts=sum(len(b.outputs) for b in with_head),
        num_draft_tokens=num_draft_tokens,
        mean_acceptance_length=counters.mean_acceptance_length,
        acceptance_rate=counters.acceptance_rate,
        per_position_acceptance_rate=counters.per_position_acceptance_rate,
        drafts=counters.drafts,
        draft_tokens=counters.draft_tokens,
        accepted_tokens=counters.accepted_tokens,
        accepted_per_position=list(counters.accepted_per_position),
        generated_tokens_with_head=gen,
        seconds_with_head=secs,
        tokens_per_s_with_head=_rate(gen, secs),
    )
    if without_head is not None:
        base_gen = sum(b.generated_tokens for b in without_head)
        base_secs = sum(b.seconds for b in without_head)
        fig.generated_tokens_without_head = base_gen
        fig.seconds_without_head = base_secs
        fig.tokens_per_s_without_head = _rate(base_gen, base_secs)
        fig.eval_engines_tok_s_ratio = (
            fig.tokens_per_s_with_head / fig.tokens_per_s_without_head if fig.tokens_per_s_without_head else math.nan
        )
        pairs = [(x, y) for a, b in zip(with_head, without_head) for x, y in zip(a.outputs, b.outputs)]
        fig.greedy_matches = sum(x == y for x, y in pairs)
        fig.greedy_match_rate = fig.greedy_matches / len(pairs) if pairs else math.nan
    return fig


def consistency_problems(batch: BatchResult, num_draft_tokens: int) -> list[str]:
    """The batch's counter difference must obey vLLM's invariants and agree with the sum of
    its per-request histograms (two independent routes out of vLLM); say where it does not."""
    if batch.counters is None:
        return []
    counters = SpecDecodeCounters.from_dict(batch.counters)
    problems = [f"{batch.name}: {p}" for p in counters.inconsistencies(num_draft_tokens)]
    if batch.histograms and all(batch.histograms):
        rebuilt = counters_from_histograms(batch.histograms, num_draft_tokens)
        for key in ("drafts", "accepted_tokens", "accepted_per_position"):
            got, want = getattr(rebuilt, key), getattr(counters, key)
            if got != want:
                problems.append(f"{batch.name}: {key} from per-request histograms {got} != from counters {want}")
    return problems


def prompt_outcomes(
    with_head: BatchResult,
    without_head: BatchResult | None,
    ids: list[str],
    prompt_lengths: list[int],
    categories: list[str] | None = None,
) -> list[PromptOutcome]:
    """One outcome per request: the prompts' first turns in order, then their second turns
    (``with_head.followups``), each named ``<id>#2``."""
    k = len((with_head.counters or {}).get("accepted_per_position", []))
    rows = [(ids[i], prompt_lengths[i], (categories or [with_head.name] * len(ids))[i], 1) for i in range(len(ids))]
    for f in with_head.followups or []:
        rows.append((f"{ids[f['of']]}#2", f["prompt_tokens"], rows[f["of"]][2], 2))
    out = []
    for i, output in enumerate(with_head.outputs):
        hist = with_head.histograms[i] if with_head.histograms else []
        unit = unit_of_histograms([hist], k) if hist else None
        base = without_head.outputs[i] if without_head is not None and i < len(without_head.outputs) else None
        diff = first_difference(output, base) if base is not None else None
        pid, length, category, turn = rows[i]
        out.append(
            PromptOutcome(
                source=with_head.name,
                id=pid,
                prompt_tokens=length,
                output_tokens=len(output),
                acceptance_length=acceptance_length_of_histogram(hist) if hist else math.nan,
                greedy_match=(output == base) if base is not None else None,
                first_difference=diff,
                category=category,
                turn=turn,
                drafts=unit.drafts if unit else 0,
                accepted_per_position=list(unit.accepted_per_position) if unit else [],
                finish_reason=with_head.finish_reasons[i] if with_head.finish_reasons else None,
            )
        )
    return out
