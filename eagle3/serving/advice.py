"""How many draft tokens K to serve a head with, per load (concurrent requests), and where it
stops paying: the export's ``serving.json`` (metadata beside config.json, which vLLM reads and
which stays as it is). train.py and ``python export.py`` print the ``vllm serve`` command
from it.

Two sources, the measured one winning:

- ``measured``: ``python evaluate.py export_dir=<dir> serving.measure=true``
  (eagle3/serving/speedup.py) ran the target alone and with the head at each load
  and K on a GPU. Per load, the K with the highest measured speed-up, or
  0 (serve the target alone) where none beats the target alone by ``MIN_SPEEDUP["measured"]``.
- ``rule``: the head was measured for acceptance only (train.py's end-of-run evaluation or
  ``python evaluate.py``: vLLM's per-position acceptance rates a_j on the held-out suite, the
  lower end of their interval, ``per_position_acceptance_rate_lower`` of acceptance.json, where
  it has one: never the validation split's in-distribution figure, which a head trained on one
  source beats the traffic it serves by, nor the point estimate, whose error could flip the sign). A verify step with
  K drafts emits on average ``L(K) = 1 + a_0 + ... + a_{K-1}`` tokens (a_j is the share of
  verify steps that accepted draft j and so all before it) and costs ``c(K, load)`` plain
  decode steps of the target alone, so the predicted speed-up is ``L(K) / c(K, load)``. Only
  K up to the positions measured are considered (a_j beyond them is unknown).

Where a speed-up was measured at a load (natural EOS, a queue kept at that load), it wins over
the prediction at that load: the rule fills in only the loads not measured (``combine``). Each
load's advice says which it is (``basis``).

The step cost ``c(K, load)`` belongs to the target, the GPU and the engine, not to the head, so
it is measured once by the serving measurement (eagle3/serving/speedup.py): there ``c = L / speed-up`` (tokens/s with the head = L verify
steps' tokens per step time; the target alone emits one token per step). Between measured K it
is the line ``c = 1 + f + s*K`` fitted per load (``f``: the fixed cost of speculating at all,
``s``: the cost of one more draft token; ``f = 0`` when the table has one K at that load), and
between measured loads ``f`` and ``s`` are interpolated in log(load). A verify step does at least
a plain step's work, and a step with K drafts all the work of one with fewer plus more, so c is
never taken below 1 nor below c of a smaller K at the same load: an entry that breaks this is the
waves' timing noise (measured at MoE shapes, where one load's waves vary by a third between runs),
and taking it would advise a head of any acceptance, or a K whose cheapness is noise.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Optional

from eagle3.draft.export_files import ADVICE, WEIGHTS
from eagle3.target_model.resolve import read_hf_config
from eagle3.target_model.size import TargetSize, target_size

FILE_NAME = ADVICE
ADVICE_LOADS = (1, 8, 32, 64)  # the loads the rule advises for (the bench's default loads)
# A K is advised only where it beats the target alone by this factor: below it, the waves'
# timing noise (measured) or the rule's model error (rule) could make the head a slow-down.
MIN_SPEEDUP = {"measured": 1.02, "rule": 1.05}

STEP_COSTS_FILE = Path(__file__).with_name("step_costs.yaml")


@dataclass(frozen=True)
class StepCostClass:
    """c(K, load) in plain decode steps measured for one size of target (step_costs.yaml). On a
    135M target every step is launch-bound, so a drafter pass weighs as much as a target pass
    (c(3, 1) = 2.1); on an 8B target the drafter is a small share of the step (c(3, 1) = 1.16),
    so the same acceptance pays off at loads where the small target's does not."""

    name: str
    params: float
    active_params: float
    source: str
    costs: dict[int, dict[int, float]]

    def distance(self, size: TargetSize) -> float:
        """How far a target is from this class: log-ratios of total and active parameters."""
        return abs(math.log(size.params / self.params)) + abs(math.log(size.active_params / self.active_params))


@cache
def step_cost_classes() -> tuple[StepCostClass, ...]:
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(STEP_COSTS_FILE))
    assert isinstance(raw, list), f"{STEP_COSTS_FILE}: expected a list of classes"
    return tuple(
        StepCostClass(
            str(c["name"]),
            float(c["params"]),
            float(c["active_params"]),
            " ".join(str(c["source"]).split()),
            {int(load): {int(k): float(v) for k, v in by_k.items()} for load, by_k in c["costs"].items()},
        )
        for c in raw
    )


def step_cost_class(size: Optional[TargetSize]) -> StepCostClass:
    """The measured class nearest the target; the smallest (the costliest drafting relative to a
    target step, so the most cautious advice) when the target's size is unknown."""
    classes = step_cost_classes()
    if size is None:
        return min(classes, key=lambda c: c.params)
    return min(classes, key=lambda c: c.distance(size))


def target_dir_size(target_dir: Optional[str | Path]) -> Optional[TargetSize]:
    """The size of a local target directory from its config.json (None: not a local directory)."""
    if not target_dir or not (Path(target_dir) / "config.json").is_file():
        return None
    return target_size(read_hf_config(target_dir))


@dataclass
class LoadAdvice:
    load: int  # concurrent requests
    num_speculative_tokens: int  # 0: serve the target alone at this load
    speedup: float  # tokens/s with the head at that K / the target alone's (1.0 for K = 0)
    basis: str = ""  # "measured" | "predicted"


@dataclass
class ServingAdvice:
    source: str  # "measured" | "rule"
    loads: list[LoadAdvice] = field(default_factory=list)
    head_sha256: Optional[str] = None  # model.safetensors it was made for (a re-export keeps it only if equal)
    inputs: dict[str, Any] = field(default_factory=dict)  # what it was computed from (rates, step costs, device)

    def at(self, load: int) -> Optional[LoadAdvice]:
        return next((a for a in self.loads if a.load == load), None)

    def pays_off(self) -> list[int]:
        return sorted(a.load for a in self.loads if a.num_speculative_tokens > 0)

    def does_not_pay(self) -> list[int]:
        return sorted(a.load for a in self.loads if a.num_speculative_tokens == 0)

    def serve_k(self) -> int:
        """The K for the command: the advice at the lowest load (a server's quiet periods,
        where speculation helps most); 0 when it does not pay there."""
        return min(self.loads, key=lambda a: a.load).num_speculative_tokens if self.loads else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ServingAdvice":
        loads = [
            LoadAdvice(int(a["load"]), int(a["num_speculative_tokens"]), float(a["speedup"]), str(a.get("basis", "")))
            for a in raw["loads"]
        ]
        return cls(str(raw["source"]), loads, raw.get("head_sha256"), dict(raw.get("inputs", {})))

    def write(self, export_dir: str | Path) -> Path:
        from eagle3.util.atomic import write_text

        path = Path(export_dir) / FILE_NAME
        write_text(path, json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def read(cls, export_dir: str | Path) -> Optional["ServingAdvice"]:
        """The export's advice, or None (no file, or made for other weights than the ones there)."""
        path = Path(export_dir) / FILE_NAME
        if not path.is_file():
            return None
        advice = cls.from_dict(json.loads(path.read_text()))
        if advice.head_sha256 and advice.head_sha256 != head_sha256(export_dir):
            return None
        return advice


def head_sha256(export_dir: str | Path) -> Optional[str]:
    weights = Path(export_dir) / WEIGHTS
    if not weights.is_file():
        return None
    h = hashlib.sha256()
    with open(weights, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def best_k(speedups: dict[int, float], min_speedup: float) -> tuple[int, float]:
    """(K, speed-up) of the fastest K, or (0, 1.0) when none reaches ``min_speedup``."""
    if not speedups:
        return 0, 1.0
    k, s = max(speedups.items(), key=lambda kv: kv[1])
    return (int(k), float(s)) if s >= min_speedup else (0, 1.0)


def from_measurements(speedups: dict[int, dict[int, float]], **inputs: Any) -> ServingAdvice:
    """``speedups[load][K]``: measured tokens/s with the head at K over the target alone's."""
    loads = [
        LoadAdvice(int(load), *best_k(by_k, MIN_SPEEDUP["measured"]), basis="measured")
        for load, by_k in sorted(speedups.items())
    ]
    return ServingAdvice("measured", loads, inputs=dict(inputs))


def combine(measured: ServingAdvice, predicted: ServingAdvice) -> ServingAdvice:
    """The measured advice, with the prediction at the loads it did not measure: a measured
    speed-up at a load always wins over what the rule says there."""
    at = {a.load: a for a in predicted.loads} | {a.load: a for a in measured.loads}
    inputs = {**measured.inputs, "predicted_loads": sorted(set(at) - {a.load for a in measured.loads})}
    inputs["rule_inputs"] = predicted.inputs
    return ServingAdvice("measured", [at[load] for load in sorted(at)], measured.head_sha256, inputs)


def step_costs(speedups: dict[int, dict[int, float]], tokens_per_step: dict[int, dict[int, float]]) -> dict:
    """The measured cost table c(K, load) = tokens per verify step / speed-up, both at (load, K)."""
    return {
        load: {k: round(tokens_per_step[load][k] / s, 3) for k, s in by_k.items() if s > 0}
        for load, by_k in speedups.items()
    }


def _line(by_k: dict[int, float]) -> tuple[float, float]:
    """(f, s) of c = 1 + f + s*K through the measured points (least squares; f = 0 for one K)."""
    ks = sorted(by_k)
    if len(ks) == 1:
        return 0.0, (by_k[ks[0]] - 1.0) / ks[0]
    mk = sum(ks) / len(ks)
    mc = sum(by_k[k] - 1.0 for k in ks) / len(ks)
    s = sum((k - mk) * (by_k[k] - 1.0 - mc) for k in ks) / sum((k - mk) ** 2 for k in ks)
    return mc - s * mk, s


def _table_cost(k: int, load: int, table: dict[int, dict[int, float]]) -> float:
    """c(K, load) as the table says: measured where it has it, else the fitted line."""
    if k in table.get(load, {}):
        return table[load][k]
    known = sorted(table)
    lo = max((x for x in known if x <= load), default=known[0])
    hi = min((x for x in known if x >= load), default=known[-1])
    (f_lo, s_lo), (f_hi, s_hi) = _line(table[lo]), _line(table[hi])
    w = 0.0 if hi == lo else (math.log(load) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return 1.0 + (f_lo + w * (f_hi - f_lo)) + (s_lo + w * (s_hi - s_lo)) * k


def cost(k: int, load: int, table: dict[int, dict[int, float]]) -> float:
    """c(K, load) (see the module doc): never below one plain step, nor below the cost of fewer
    drafts at the same load."""
    return max(1.0, *(_table_cost(j, load, table) for j in range(1, k + 1)))


def expected_tokens_per_step(per_position_rate: list[float], k: int) -> float:
    return 1.0 + sum(per_position_rate[:k])


def from_rule(
    per_position_rate: list[float],
    table: Optional[dict[int, dict[int, float]]] = None,
    loads: tuple[int, ...] = ADVICE_LOADS,
    draft_tokens: tuple[int, ...] = (1, 2, 3, 5),
    size: Optional[TargetSize] = None,
) -> ServingAdvice:
    """Predicted advice for a head measured only for acceptance (the module doc's rule), with the
    step costs ``table`` or else those of the class nearest the target's ``size``."""
    cls = step_cost_class(size) if table is None else None
    costs = cls.costs if cls is not None else table
    assert costs is not None
    usable = [k for k in draft_tokens if k <= len(per_position_rate)]
    advice = []
    for load in loads:
        predicted = {k: expected_tokens_per_step(per_position_rate, k) / cost(k, load, costs) for k in usable}
        advice.append(LoadAdvice(load, *best_k(predicted, MIN_SPEEDUP["rule"]), basis="predicted"))
    inputs: dict[str, Any] = {
        "per_position_acceptance_rate": [round(r, 4) for r in per_position_rate],
        "step_costs": {str(k): v for k, v in costs.items()},
        "step_costs_class": cls.name if cls is not None else "given",
        "step_costs_source": cls.source if cls is not None else "given",
        "target_size": size.describe() if size is not None else "unknown",
    }
    return ServingAdvice("rule", advice, inputs=inputs)


def acceptance_rates(acceptance: Optional[dict[str, Any]]) -> tuple[list[float], str]:
    """(per-position rates, what they are) the rule predicts from: the held-out suite's lower
    bound where acceptance.json has one, else its point figures (an older file, or a vLLM that
    gives no per-request figures, so no interval); [] when there are none."""
    acceptance = acceptance or {}
    lower = acceptance.get("per_position_acceptance_rate_lower")
    label = (acceptance.get("headline") or {}).get("label", "all prompts")
    if lower:
        rates, basis = lower, f"{label}: lower end of the 95% interval"
    else:
        rates, basis = acceptance.get("per_position_acceptance_rate") or [], f"{label}: point estimate (no interval)"
    rates = [float(r) if r is not None else math.nan for r in rates]
    return ([] if not rates or any(math.isnan(r) for r in rates) else rates), basis


def _stored_costs(advice: ServingAdvice) -> Optional[dict[int, dict[int, float]]]:
    raw = advice.inputs.get("step_costs")
    if not raw:
        return None
    return {int(load): {int(k): float(c) for k, c in by_k.items()} for load, by_k in raw.items()}


def advice_for(
    export_dir: str | Path, acceptance: Optional[dict[str, Any]] = None, target_dir: Optional[str | Path] = None
) -> Optional[ServingAdvice]:
    """The export's advice. A measured serving.json (for these weights) is kept, with the rule on
    ``acceptance`` (an acceptance.json dict: ``acceptance_rates``) filling in the loads it did not
    measure, at its own measured step costs. Otherwise the rule on ``acceptance`` with the step
    costs of the class nearest the target (its size read from ``target_dir``'s config.json),
    written as serving.json; a stored rule advice where no acceptance is given; else None."""
    stored = ServingAdvice.read(export_dir)
    rates, basis = acceptance_rates(acceptance)
    if stored is not None and (stored.source == "measured" or not rates):
        missing = [load for load in ADVICE_LOADS if stored.at(load) is None]
        if stored.source != "measured" or not rates or not missing:
            return stored
        rule = from_rule(rates, _stored_costs(stored), loads=tuple(missing), size=target_dir_size(target_dir))
        rule.inputs["acceptance"] = basis
        return combine(stored, rule)
    if not rates:
        return None
    advice = from_rule(rates, size=target_dir_size(target_dir))
    advice.inputs["acceptance"] = basis
    advice.head_sha256 = head_sha256(export_dir)
    advice.write(export_dir)
    return advice
