"""acceptance.json reports as evaluate.py writes them, made from each prompt's figures: for the
tests that compare two heads' reports (eagle3/evaluation/gap.py and what reads it)."""

from __future__ import annotations

K = 3
HEADLINE = ["broad", "math_word"]

# a turn's figures: (verify steps with drafts, accepted drafts per position)
Turn = tuple[int, list[int]]


def acceptance_json(
    prompts: dict[tuple[str, str], list[Turn]],
    *,
    k: int = K,
    headline_sets: list[str] = HEADLINE,
    max_new_tokens: int = 64,
    per_request: bool = True,
) -> dict:
    """An acceptance.json as evaluate.py writes it, from each prompt's turns (key: (source, id)):
    per_prompt entries (a second turn's id ends "#2"), by_source counters, the headline and
    in_distribution; ``per_request=False``: as a vLLM without per-request figures writes it
    (drafts 0 in every entry, engine.per_request_figures false), the counters unchanged."""
    per_prompt, by_source, units = [], {}, {}
    for (source, pid), turns in prompts.items():
        units[source] = units.get(source, 0) + 1
        for t, (drafts, accepted) in enumerate(turns, start=1):
            per_prompt.append(
                {
                    "source": source,
                    "id": pid if t == 1 else f"{pid}#{t}",
                    "turn": t,
                    "category": source,
                    "drafts": drafts if per_request else 0,
                    "accepted_per_position": list(accepted) if per_request else [],
                    "acceptance_length": 1 + sum(accepted) / drafts if per_request and drafts else None,
                }
            )
            fig = by_source.setdefault(source, {"prompts": 0, "drafts": 0, "accepted_per_position": [0] * k})
            fig["prompts"] += 1  # by_source counts requests (turns)
            fig["drafts"] += drafts
            fig["accepted_per_position"] = [x + y for x, y in zip(fig["accepted_per_position"], accepted)]
    for fig in by_source.values():
        rates = [x / fig["drafts"] for x in fig["accepted_per_position"]]
        fig.update(num_draft_tokens=k, mean_acceptance_length=1 + sum(rates), per_position_acceptance_rate=rates)
    val = by_source.get("val")
    return {
        "max_new_tokens": max_new_tokens,
        "num_draft_tokens": k,
        "headline": {"label": "held-out suite", "sets": list(headline_sets), "prompts": 0},
        "in_distribution": None if val is None else {"label": "validation split (in-distribution)", **val},
        "prompts": units,
        "set_labels": {s: s for s in by_source},
        "by_source": by_source,
        "engine": {"vllm_version": "0.32.0" if per_request else "0.26.0", "per_request_figures": per_request},
        "per_prompt": per_prompt,
    }
