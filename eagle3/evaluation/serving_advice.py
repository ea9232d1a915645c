"""How many draft tokens to serve a head with, per load (concurrent requests), and where it
stops paying: the export's ``serving.json``, read by train.py and ``python -m eagle3.export``
when they print the ``vllm serve`` command.

Two sources, the measured one winning:

- ``measured``: bench/serving_speedup.py ran the target alone and with the head at each load
  and number of draft tokens K on a GPU; the advice per load is the K with the highest
  measured speed-up, or 0 (serve without the head) where none beats the target alone.
- ``rule``: no measurement of this head. A verify step with K drafts yields on average
  ``1 + sum_j a_j`` tokens (a_j: the head's per-position acceptance rate, vLLM's counters), and
  costs ``c(K, load)`` plain decode steps. ``c`` is a property of the target, the GPU and the
  load, not of the head, so it is taken from a measured table (STEP_COSTS: cost = tokens per
  step / speed-up, as bench/serving_speedup.py measured it for SmolLM2-135M on one H200 with
  CUDA vLLM 0.26, docs/results.md); the predicted speed-up is ``(1 + sum_j a_j) / c(K, load)``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FILE_NAME = "serving.json"

# c(K, load): the cost of one verify step with K drafts, in plain decode steps, measured by
# bench/serving_speedup.py (SmolLM2-135M, one H200, CUDA vLLM 0.26.0, greedy, CUDA graphs).
# Keys: load -> {K: cost}. Filled from docs/results.md's serving table.
STEP_COSTS: dict[int, dict[int, float]] = {}


@dataclass
class LoadAdvice:
    load: int  # concurrent requests
    num_speculative_tokens: int  # 0: serve without the head at this load
    speedup: float  # measured (or predicted) tokens/s with the head / without, at that K


@dataclass
class ServingAdvice:
    source: str  # "measured" | "rule"
    loads: list[LoadAdvice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> LoadAdvice | None:
        """The advice at the lowest load (one request in flight: latency-bound serving)."""
        return min(self.loads, key=lambda a: a.load) if self.loads else None

    def pays_off(self) -> list[int]:
        return [a.load for a in self.loads if a.num_speculative_tokens > 0]

    def does_not_pay(self) -> list[int]:
        return [a.load for a in self.loads if a.num_speculative_tokens == 0]

    def summary_line(self) -> str:
        if not self.loads:
            return "serving advice: none (no measurement and no step-cost table for this target)"
        parts = [
            f"{a.load}: K={a.num_speculative_tokens} ({a.speedup:.2f}x)" if a.num_speculative_tokens
            else f"{a.load}: without the head"
            for a in sorted(self.loads, key=lambda a: a.load)
        ]
        pays = self.pays_off()
        verdict = f"the head pays off at {', '.join(map(str, pays))} concurrent requests" if pays else "it pays at no load measured"
        more = f"; serve without it at {', '.join(map(str, self.does_not_pay()))}" if self.does_not_pay() else ""
        return f"serving advice ({self.source}), per load: {'; '.join(parts)}. {verdict}{more}"

    def write(self, export_dir: str | Path) -> Path:
        path = Path(export_dir) / FILE_NAME
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def read(cls, export_dir: str | Path) -> "ServingAdvice | None":
        path = Path(export_dir) / FILE_NAME
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        return cls(raw["source"], [LoadAdvice(**a) for a in raw["loads"]], list(raw.get("notes", [])))


def from_measurements(speedups: dict[int, dict[int, float]]) -> ServingAdvice:
    """``speedups[load][K]``: measured tokens/s with the head at K over the target alone."""
    loads = []
    for load, by_k in sorted(speedups.items()):
        k, s = max(by_k.items(), key=lambda kv: kv[1]) if by_k else (0, 1.0)
        loads.append(LoadAdvice(int(load), int(k) if s > 1.0 else 0, float(s) if s > 1.0 else 1.0))
    return ServingAdvice("measured", loads)


def expected_tokens_per_step(per_position_rate: list[float], k: int) -> float:
    """1 + the sum of the first k per-position acceptance rates (vLLM's counters: the share of
    drafts whose position j was accepted, all earlier positions accepted too)."""
    return 1.0 + sum(per_position_rate[:k])


def from_rule(per_position_rate: list[float], costs: dict[int, dict[int, float]] | None = None) -> ServingAdvice:
    """Predicted advice for a head measured only for acceptance (see the module docstring)."""
    table = STEP_COSTS if costs is None else costs
    loads = []
    usable = len(per_position_rate)
    for load, by_k in sorted(table.items()):
        predicted = {
            k: expected_tokens_per_step(per_position_rate, k) / cost for k, cost in by_k.items() if 0 < k <= usable
        }
        k, s = max(predicted.items(), key=lambda kv: kv[1]) if predicted else (0, 1.0)
        loads.append(LoadAdvice(int(load), int(k) if s > 1.0 else 0, float(s) if s > 1.0 else 1.0))
    note = f"per-position acceptance {[round(r, 3) for r in per_position_rate]}; step costs measured on one H200"
    return ServingAdvice("rule", loads, [note])


def step_costs(speedups: dict[int, dict[int, float]], tokens_per_step: dict[int, float]) -> dict[int, dict[int, float]]:
    """The measured cost table: c(K, load) = tokens per verify step at K / speed-up."""
    return {
        load: {k: tokens_per_step[k] / s for k, s in by_k.items() if s > 0 and k in tokens_per_step}
        for load, by_k in speedups.items()
    }


def advice_for(export_dir: str | Path, acceptance: dict[str, Any] | None = None) -> ServingAdvice:
    """The export's measured advice if it has one, else the rule on ``acceptance`` (an
    acceptance.json dict with ``per_position_acceptance_rate``), else an empty advice."""
    measured = ServingAdvice.read(export_dir)
    if measured is not None:
        return measured
    acc = acceptance or {}
    rates = acc.get("per_position_acceptance_rate")
    if not rates and acc.get("drafts"):
        rates = [a / acc["drafts"] for a in acc.get("accepted_per_position", [])]
    if rates and STEP_COSTS:
        return from_rule([float(r) for r in rates])
    return ServingAdvice("none")


def advice_from_acceptance_file(export_dir: str | Path, acceptance_json: str | Path | None) -> ServingAdvice:
    """``advice_for`` with the acceptance.json that evaluation wrote (None or missing: none)."""
    acc = None
    if acceptance_json and Path(acceptance_json).is_file():
        acc = json.loads(Path(acceptance_json).read_text())
    return advice_for(export_dir, acc)


def serving_lines(export_dir: str | Path, verifier: str, num_draft_tokens: int, advice: ServingAdvice) -> list[str]:
    """The ``vllm serve`` command with the advised K at one request in flight (the trained K
    when there is no advice), and the advice per load."""
    best = advice.best
    k = best.num_speculative_tokens if best is not None and best.num_speculative_tokens > 0 else num_draft_tokens
    spec = json.dumps({"model": str(export_dir), "method": "eagle3", "num_speculative_tokens": int(k)})
    return [f"serve it: vllm serve {verifier} --speculative-config '{spec}'", advice.summary_line()]
