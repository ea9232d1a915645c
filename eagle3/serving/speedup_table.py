"""The serving measurement's tables (eagle3/serving/speedup.py), from its engines' results.

Two per load and K, from the batches of one engine per K:

- ``natural``: the headline, the traffic a server gets. A load of c keeps c requests in flight
  from a queue (a request starts as soon as one ends), every answer ending at EOS or at
  max_new_tokens (batches ``eos-<c>``). Its tokens/s and speed-up are the ones printed and
  advised.
- ``waves``: the step-cost instrument ("step-cost waves, ignore_eos"). Waves of exactly c
  requests that all run to max_new_tokens (batches ``load-<c>``), so c are in flight from a
  wave's first step to its last: the cost of a verify step at load c, c(K, load) = tokens per
  verify step / speed-up (eagle3/serving/advice.py), which a natural-EOS run cannot give (its
  load thins as answers end, and drafting past an answer's end is work no user sees).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagle3.evaluation.engine_io import BatchResult, EngineResult
from eagle3.serving import advice as advice_rules

NATURAL_LABEL = "natural EOS, c requests kept in flight from a queue"
WAVES_LABEL = "step-cost waves, ignore_eos"


def wave_name(load: int) -> str:
    return f"load-{load}"


def natural_name(load: int) -> str:
    return f"eos-{load}"


def batch_of(result: EngineResult, name: str) -> BatchResult:
    found = next((b for b in result.batches if b.name == name), None)
    if found is None:
        raise ValueError(f"engine result: no batch {name!r}, got {[b.name for b in result.batches]}")
    return found


def summarise(
    alone: EngineResult, with_head: dict[int, EngineResult], load_prompts: dict[int, list[int]], max_new_tokens: int
) -> dict[int, dict[str, Any]]:
    """The step-cost waves per load: the target alone's tok/s, per K tok/s, speed-up, acceptance and equality."""
    first = min(load_prompts)
    # prompt -> output at the first load
    base_first = dict(zip(load_prompts[first], batch_of(alone, wave_name(first)).outputs))

    def alone_facts(load: int, idx: list[int], base: BatchResult, base_tps: float) -> dict[str, Any]:
        return {
            "target_alone_tok_s": base_tps,
            "target_alone_wave_sizes": sorted(set(base.wave_sizes or [])),
            "target_alone_preemptions": base.preemptions,
            # batch-shape numerics alone: the target at this load against itself at the first
            "target_alone_equal_to_first_load": sum(o == base_first[i] for i, o in zip(idx, base.outputs)) / len(idx),
        }

    return _load_table(alone, with_head, load_prompts, wave_name, alone_facts, full_length=max_new_tokens)


def summarise_natural(
    alone: EngineResult, with_head: dict[int, EngineResult], load_prompts: dict[int, list[int]]
) -> dict[int, dict[str, Any]]:
    """The natural-EOS runs per load: tok/s of the target alone and per K, speed-up, acceptance."""

    def alone_facts(load: int, idx: list[int], base: BatchResult, base_tps: float) -> dict[str, Any]:
        return {
            "concurrency": load,
            "target_alone_tok_s": base_tps,
            "target_alone_mean_output_tokens": base.generated_tokens / len(idx),
            "target_alone_preemptions": base.preemptions,
        }

    return _load_table(alone, with_head, load_prompts, natural_name, alone_facts)


def _load_table(
    alone: EngineResult,
    with_head: dict[int, EngineResult],
    load_prompts: dict[int, list[int]],
    batch_name: Callable[[int], str],
    alone_facts: Callable[[int, list[int], BatchResult, float], dict[str, Any]],
    full_length: int | None = None,
) -> dict[int, dict[str, Any]]:
    """A row per load: its requests, ``alone_facts`` (the target alone's figures there), per K the
    head's figures against the target alone's (``_k_row``; with ``full_length``, also whether every
    answer ran to that many tokens) and the best K. ``batch_name``: the load's batch in each result."""
    table: dict[int, dict[str, Any]] = {}
    for load, idx in load_prompts.items():
        base = batch_of(alone, batch_name(load))
        base_tps = base.generated_tokens / base.seconds
        by_k: dict[int, dict[str, Any]] = {}
        for k, res in sorted(with_head.items()):
            batch = batch_of(res, batch_name(load))
            by_k[k] = _k_row(batch, base, base_tps, len(idx))
            if full_length is not None:
                by_k[k]["all_full_length"] = all(len(o) == full_length for o in batch.outputs)
        row: dict[str, Any] = {"requests": len(idx), **alone_facts(load, idx, base, base_tps), "by_k": by_k}
        _best(row)
        table[load] = row
    return table


def _best(row: dict[str, Any]) -> None:
    best, speedup = advice_rules.best_k(
        {k: v["speedup"] for k, v in row["by_k"].items()}, advice_rules.MIN_SPEEDUP["measured"]
    )
    row["best_k"], row["best_speedup"] = best, speedup


def _k_row(r: BatchResult, base: BatchResult, base_tps: float, n: int) -> dict[str, Any]:
    c = r.counters or {}
    drafts = c.get("drafts", 0)
    tps = r.generated_tokens / r.seconds
    return {
        "tok_s": tps,
        "speedup": tps / base_tps,
        "acceptance_length": 1.0 + c.get("accepted_tokens", 0) / drafts if drafts else float("nan"),
        "per_position": [a / drafts for a in c.get("accepted_per_position", [])] if drafts else [],
        "outputs_equal": sum(a == o for a, o in zip(r.outputs, base.outputs)) / n,
        "mean_output_tokens": r.generated_tokens / n,
        "wave_sizes": sorted(set(r.wave_sizes or [])),
        "preemptions": r.preemptions,
    }


def table_step_costs(table: dict[int, dict[str, Any]]) -> tuple[dict, dict]:
    """(speed-ups, step costs c(K, load)) of a table, per load and K."""
    speedups = {load: {k: v["speedup"] for k, v in row["by_k"].items()} for load, row in table.items()}
    per_step = {load: {k: v["acceptance_length"] for k, v in row["by_k"].items()} for load, row in table.items()}
    return speedups, advice_rules.step_costs(speedups, per_step)


def print_table(table: dict[int, dict[str, Any]], label: str = NATURAL_LABEL, verdicts: bool = True) -> None:
    print(f"{label}:")
    print("| load | K | tok/s | speed-up | acceptance length | per position | outputs equal |")
    print("|---|---|---|---|---|---|---|")
    for load, row in table.items():
        equal = row.get("target_alone_equal_to_first_load")
        equal_text = f"{equal:.2f} (vs load {min(table)})" if equal is not None else ""
        print(f"| {load} | 0 | {row['target_alone_tok_s']:,.1f} | 1.00x | | | {equal_text} |")
        for k, v in row["by_k"].items():
            pos = " / ".join(f"{p:.2f}" for p in v["per_position"])
            print(
                f"| {load} | {k} | {v['tok_s']:,.1f} | {v['speedup']:.2f}x | {v['acceptance_length']:.2f} | {pos} | "
                f"{v['outputs_equal']:.2f} |"
            )
    print()
    if not verdicts:
        return
    for load, row in table.items():
        verdict = f"K={row['best_k']} ({row['best_speedup']:.2f}x)" if row["best_k"] else "0 (the target alone)"
        print(f"best K at {load} concurrent requests ({label}): {verdict}")
