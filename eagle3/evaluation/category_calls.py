"""A prompt set run one category at a time, and its results put back together as the set's.

Where vLLM gives no per-request spec-decode figures (CUDA vLLM 0.26), the engine's cumulative
counters are the only route to acceptance, and a counter difference covers exactly the requests
of the calls between its two snapshots. So the engine runs each category's prompts as a call of
their own (second turns included) with snapshots around it: each category gets its own figures,
and the set's counters are the sum of its categories'. With eval.prompts_apart the calls are one
prompt each (``prompt_calls``): one request in flight, so its counter difference is its own figures
(a histogram per request, eagle3/evaluation/counters.py ``histogram_from_counters``). Imports no
vLLM (eagle3/evaluation/engine.py calls these around its generate() calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from eagle3.evaluation.counters import SpecDecodeCounters
from eagle3.evaluation.engine_io import BatchResult, PromptBatch


@dataclass
class CategoryCall:
    category: str
    rows: list[int]  # the category's prompts' indices in the set, in order
    batch: PromptBatch  # those prompts alone (their second turns beside them)


def _labels(batch: PromptBatch) -> list[str]:
    labels = batch.categories or [batch.name] * len(batch.prompts)
    if len(labels) != len(batch.prompts):
        raise ValueError(
            f"prompt batch {batch.name!r}: categories: expected one per prompt ({len(batch.prompts)}), got {len(labels)}"
        )
    return labels


def category_calls(batch: PromptBatch) -> list[CategoryCall]:
    """One call per category of ``batch`` (``batch.categories``; none: the set is one category,
    named as the set), categories in order of first appearance, each in prompt order."""
    labels = _labels(batch)
    rows: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        rows.setdefault(label, []).append(i)
    calls = []
    for label, idx in rows.items():
        turns = [batch.second_turns[i] for i in idx] if batch.second_turns else None
        part = PromptBatch(
            batch.name,
            [batch.prompts[i] for i in idx],
            ignore_eos=batch.ignore_eos,
            second_turns=turns if turns and any(turns) else None,
        )
        calls.append(CategoryCall(label, idx, part))
    return calls


def prompt_calls(batch: PromptBatch) -> list[CategoryCall]:
    """One call per prompt of ``batch``, in prompt order, each with its second turn (if any) and
    named by its category (``batch.categories``; none: the set's name)."""
    labels = _labels(batch)
    calls = []
    for i, label in enumerate(labels):
        turn = batch.second_turns[i] if batch.second_turns else None
        turns: list[dict[str, Any] | None] | None = [turn] if turn else None
        part = PromptBatch(batch.name, [batch.prompts[i]], ignore_eos=batch.ignore_eos, second_turns=turns)
        calls.append(CategoryCall(label, [i], part))
    return calls


def merge_category_results(name: str, n_prompts: int, parts: list[tuple[CategoryCall, BatchResult]]) -> BatchResult:
    """The set's result from its categories' (as one call over the set would give it): first turns
    in prompt order, then the second turns in the order of their first turns; counters summed,
    each category's kept (``category_counters``: summed over its calls where it had several);
    seconds and preemptions summed."""
    first: list[Optional[tuple[list[int], Any, Optional[str]]]] = [None] * n_prompts
    second: list[tuple[int, int, list[int], Any, Optional[str]]] = []
    for call, result in parts:
        rows = len(call.rows)

        def row(i: int, result: BatchResult = result) -> tuple[list[int], Any, Optional[str]]:
            hist = result.histograms[i] if result.histograms is not None else None
            reason = result.finish_reasons[i] if result.finish_reasons is not None else None
            return result.outputs[i], hist, reason

        for i, at in enumerate(call.rows):
            first[at] = row(i)
        for j, f in enumerate(result.followups or []):
            second.append((call.rows[f["of"]], f["prompt_tokens"], *row(rows + j)))
    if any(r is None for r in first):
        raise ValueError(
            f"prompt batch {name!r}: the category calls cover {sum(r is not None for r in first)} of {n_prompts} prompts"
        )
    second.sort(key=lambda s: s[0])
    ordered = [r for r in first if r is not None] + [s[2:] for s in second]
    results = [r for _, r in parts]
    with_hist = all(r.histograms is not None for r in results)
    with_reasons = all(r.finish_reasons is not None for r in results)
    preempted = [r.preemptions for r in results if r.preemptions is not None]
    merged = BatchResult(
        name,
        [o for o, _, _ in ordered],
        sum(r.seconds for r in results),
        histograms=[h for _, h, _ in ordered] if with_hist else None,
        preemptions=sum(preempted) if preempted else None,
        followups=[{"of": of, "prompt_tokens": tokens} for of, tokens, *_ in second] or None,
        finish_reasons=[str(f) for _, _, f in ordered] if with_reasons else None,
    )
    counted = [(call.category, SpecDecodeCounters.from_dict(r.counters)) for call, r in parts if r.counters is not None]
    if counted:
        total, by_category = SpecDecodeCounters(), dict[str, SpecDecodeCounters]()
        for category, counters in counted:
            total = total + counters
            by_category[category] = by_category.get(category, SpecDecodeCounters()) + counters
        merged.counters = total.to_dict()
        merged.category_counters = {c: counters.to_dict() for c, counters in by_category.items()}
    return merged
