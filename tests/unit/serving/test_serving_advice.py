"""Serving advice (eagle3/serving/advice.py): the number of draft tokens per load,
from measured speed-ups or predicted from acceptance and step costs; its file in the export,
kept only for the weights it was made for; and the `vllm serve` lines printed from it.

The rule's figures are worked by hand here from the module's formula, so a change to the
arithmetic (the fitted line, the log-load interpolation, the thresholds) fails a test.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from eagle3.serving import advice as sa
from eagle3.serving import serve_command as sc
from eagle3.target_model.size import TargetSize, target_size

RATES = [0.6, 0.4, 0.25]  # per-position acceptance rates a_0..a_2
TABLE = {1: {3: 1.669}, 8: {3: 2.058}, 64: {3: 3.029}}  # c(3, load): one K per load, so f = 0


def _hand_cost(k: int, load: int) -> float:
    """c = 1 + s*K with s = (c(3) - 1) / 3 per measured load, s interpolated in log(load)."""
    s = {n: (TABLE[n][3] - 1) / 3 for n in TABLE}
    lo = max(n for n in TABLE if n <= load)
    hi = min(n for n in TABLE if n >= load)
    w = 0.0 if lo == hi else math.log(load / lo) / math.log(hi / lo)
    return 1 + (s[lo] + w * (s[hi] - s[lo])) * k


def test_the_rule_predicts_tokens_per_step_over_step_cost():
    advice = sa.from_rule(RATES, TABLE, loads=(1, 8, 32, 64), draft_tokens=(1, 2, 3))
    assert advice.source == "rule"
    predicted = {load: {k: (1 + sum(RATES[:k])) / _hand_cost(k, load) for k in (1, 2, 3)} for load in (1, 8, 32, 64)}
    # load 1: K=2 wins (2.0 / 1.446 = 1.383 against 1.308 at K=1 and 1.348 at K=3)
    best1 = max(predicted[1], key=predicted[1].get)
    assert best1 == 2 and advice.at(1).num_speculative_tokens == 2
    assert advice.at(1).speedup == pytest.approx(predicted[1][2], rel=1e-9)
    for load in (32, 64):  # nothing reaches 1.05x: serve the target alone
        assert max(predicted[load].values()) < sa.MIN_SPEEDUP["rule"]
        assert advice.at(load).num_speculative_tokens == 0 and advice.at(load).speedup == 1.0
    assert advice.pays_off() == [1, 8] and advice.does_not_pay() == [32, 64]
    assert advice.serve_k() == 2
    # the measured point itself is returned as measured, not refitted
    assert sa.cost(3, 8, TABLE) == 2.058


def test_the_rule_only_uses_positions_that_were_measured():
    advice = sa.from_rule([0.9], TABLE, loads=(1,), draft_tokens=(1, 2, 3, 5))
    assert advice.at(1).num_speculative_tokens == 1  # a_1.. unknown: K=1 is the only candidate


def test_a_fitted_line_through_several_k():
    table = {1: {1: 1.2, 3: 1.6}}  # c - 1 = 0.2 * K exactly: f = 0, s = 0.2
    assert sa.cost(2, 1, table) == pytest.approx(1.4)
    table = {1: {1: 1.5, 3: 1.9}}  # f = 0.3, s = 0.2
    assert sa.cost(5, 1, table) == pytest.approx(1 + 0.3 + 0.2 * 5)


def test_measured_advice_takes_the_fastest_k_above_the_noise_floor():
    speedups = {1: {1: 1.21, 3: 1.48, 5: 1.39}, 8: {1: 1.01, 3: 0.93}, 64: {1: 0.81}}
    advice = sa.from_measurements(speedups, device="test")
    assert [(a.load, a.num_speculative_tokens) for a in advice.loads] == [(1, 3), (8, 0), (64, 0)]
    assert advice.at(1).speedup == 1.48 and advice.at(8).speedup == 1.0  # 1.01 is inside the noise
    # the step costs the bench derives: c = L / speed-up
    costs = sa.step_costs({1: {3: 1.25}}, {1: {3: 2.5}})
    assert costs == {1: {3: 2.0}}


def _export(tmp_path, seed: int):
    d = tmp_path / f"export{seed}"
    d.mkdir()
    save_file(
        {"fc.weight": torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))}, str(d / "model.safetensors")
    )
    return d


def test_the_file_is_kept_only_for_the_weights_it_was_made_for(tmp_path):
    export = _export(tmp_path, 0)
    advice = sa.from_measurements({1: {3: 1.5}}, device="test")
    advice.head_sha256 = sa.head_sha256(export)
    advice.write(export)
    back = sa.ServingAdvice.read(export)
    assert back is not None and back.to_dict() == advice.to_dict()
    # other weights in the same directory (a new training run exported there): no advice
    other = _export(tmp_path, 1)
    (export / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    assert sa.ServingAdvice.read(export) is None
    # advice_for then falls back to the rule on the acceptance it is given, and writes it
    acceptance = {"per_position_acceptance_rate": RATES}
    fresh = sa.advice_for(export, acceptance)
    assert fresh is not None and fresh.source == "rule" and fresh.head_sha256 == sa.head_sha256(export)
    assert json.loads((export / sa.FILE_NAME).read_text())["source"] == "rule"
    assert sa.advice_for(_export(tmp_path, 2), {"per_position_acceptance_rate": [float("nan")]}) is None


def test_the_printed_command_uses_the_advised_k_and_names_the_loads(tmp_path):
    export = _export(tmp_path, 0)
    advice = sa.ServingAdvice(
        "measured", [sa.LoadAdvice(1, 2, 1.4), sa.LoadAdvice(8, 1, 1.1), sa.LoadAdvice(64, 0, 1.0)]
    )
    first, per_load, verdict = sc.serving_lines(export, "org/target", 3, advice)
    spec = json.loads(first.split("--speculative-config ", 1)[1].strip("'"))
    assert first.startswith("serve it: vllm serve org/target") and spec["num_speculative_tokens"] == 2
    assert spec["model"] == str(export) and spec["method"] == "eagle3"
    assert (
        "1: K=2 (1.40x); 8: K=1 (1.10x); 64: none" in per_load
        and "measured by python evaluate.py serving.measure=true" in per_load
    )
    assert "pays off at 1, 8 concurrent requests" in verdict and "at 64 serve the target alone" in verdict
    # no load pays: the command is the target alone, the head's command beside it
    none = sa.ServingAdvice("rule", [sa.LoadAdvice(1, 0, 1.0)])
    first, _, verdict = sc.serving_lines(export, "org/target", 3, none)
    assert first.startswith("serve it: vllm serve org/target (with the head:") and "no load measured" in verdict
    # a predicted advice names the size class its step costs were measured on (unknown size: the smallest)
    _, per_load, _ = sc.serving_lines(export, "org/target", 3, sa.from_rule(RATES, loads=(1,)))
    assert "predicted from acceptance and the step costs of the SmolLM2-135M class (target: unknown;" in per_load
    # no advice at all: the trained K, and how to get advice
    lines = sc.serving_lines(export, "org/target", 3, None)
    assert (
        '"num_speculative_tokens": 3' in lines[0]
        and "python evaluate.py export_dir=<dir> serving.measure=true" in lines[1]
    )


LLAMA_8B = {  # Llama-3.1-8B's config.json, the fields a size needs
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "tie_word_embeddings": False,
}


def test_the_advice_for_an_8b_target_uses_the_8b_class_worked_by_hand(tmp_path):
    """Acceptance 0.6 / 0.4 / 0.25 per position on an 8B target: with the 8B class's step costs
    (c(K, 1) = 1.086, 1.184, 1.156; c(K, 64) = 1.119, 1.28, 1.372) K=3 wins at every load, where
    the 135M class's costs would advise the target alone at 8 requests. c(3, 1) = 1.156 was
    measured under c(2, 1) = 1.184: three drafts do all the work of two, so 1.184 is taken."""

    size = target_size(LLAMA_8B)
    assert size.params == size.active_params and 8.0e9 < size.params < 8.1e9  # 8.03B: the published count
    assert sa.step_cost_class(size).name == "Llama-3.1-8B"
    advice = sa.from_rule(RATES, size=size)
    # load 1: L(K) / c(K, 1) = 1.6 / 1.086 = 1.473, 2.0 / 1.184 = 1.689, 2.25 / 1.184 = 1.900
    assert advice.at(1).num_speculative_tokens == 3 and advice.at(1).speedup == pytest.approx(2.25 / 1.184)
    # load 64: 1.6 / 1.119 = 1.430, 2.0 / 1.28 = 1.5625, 2.25 / 1.372 = 1.640
    assert advice.at(64).num_speculative_tokens == 3 and advice.at(64).speedup == pytest.approx(2.25 / 1.372)
    assert advice.pays_off() == [1, 8, 32, 64]
    assert advice.inputs["step_costs_class"] == "Llama-3.1-8B" and advice.inputs["target_size"] == "8.03B parameters"
    small = sa.from_rule(
        RATES,
        size=target_size(
            {
                **LLAMA_8B,
                "hidden_size": 576,
                "num_hidden_layers": 30,
                "vocab_size": 49152,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "intermediate_size": 1536,
                "tie_word_embeddings": True,
            }
        ),
    )
    assert small.inputs["step_costs_class"] == "SmolLM2-135M"
    assert small.at(8).num_speculative_tokens == 0  # 2.25 / 2.238 = 1.005 < 1.05: the target alone
    # the printed lines name the class and the target's size, and the command carries the run's flags
    export = _export(tmp_path, 0)
    first, per_load, _ = sc.serving_lines(export, "org/kimi", 3, advice, tensor_parallel_size=8, trust_remote_code=True)
    assert first.startswith(
        "serve it: vllm serve org/kimi --tensor-parallel-size 8 --trust-remote-code --speculative-config"
    )
    assert "the step costs of the Llama-3.1-8B class (target: 8.03B parameters;" in per_load


def test_a_strong_head_on_an_8b_target_takes_k5_at_its_measured_cost():
    """Acceptance 0.85 / 0.8 / 0.75 / 0.7 / 0.65 per position on an 8B target: K=5's measured step
    costs (c(5, 1) = 1.502, c(5, 64) = 1.748) make five drafts the faster chain at 1 and 64
    requests, and the advice reads c(5) from the table, not from the line through K = 1, 2, 3."""

    advice = sa.from_rule([0.85, 0.8, 0.75, 0.7, 0.65], size=target_size(LLAMA_8B))
    # load 1: L(3) / c(3, 1) = 3.4 / 1.156 = 2.941; L(5) / c(5, 1) = 4.75 / 1.502 = 3.162
    assert advice.at(1).num_speculative_tokens == 5 and advice.at(1).speedup == pytest.approx(4.75 / 1.502)
    # load 64: 3.4 / 1.372 = 2.478; 4.75 / 1.748 = 2.717
    assert advice.at(64).num_speculative_tokens == 5 and advice.at(64).speedup == pytest.approx(4.75 / 1.748)
    assert sa.cost(5, 8, sa.step_cost_class(target_size(LLAMA_8B)).costs) == pytest.approx(1.535)


def test_an_moe_target_is_sized_by_total_and_active_parameters():
    """Qwen3-30B-A3B: 128 experts of 768, 8 per token: 30.5B in all, 3.3B active (the published
    figures); its nearest class is the measured MoE one, not the 8B or the 135M."""
    qwen = {
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "vocab_size": 151936,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "tie_word_embeddings": False,
    }
    size = target_size(qwen)
    assert 30.3e9 < size.params < 30.7e9 and 3.2e9 < size.active_params < 3.5e9
    assert sa.step_cost_class(size).name == "Qwen3-30B-A3B (MoE)"
    assert sa.step_cost_class(None).name == "SmolLM2-135M"


def test_the_advice_for_an_moe_target_worked_by_hand():
    """Acceptance 0.6 / 0.4 / 0.25 on a 30.5B / 3.3B-active target, the MoE class's measured costs.
    Load 1: K=3 gives 2.25 / 1.557 = 1.445x, just above K=2's 2.0 / 1.386 = 1.443x. Load 8: a
    verify step reads far more of the 128 experts than a plain one (c = 2.455 / 2.589 / 2.61), so
    the best, K=3 at 2.25 / 2.61 = 0.86x, is a slow-down: serve the target alone, where the 8B
    class's costs (c(3, 8) = 1.179, taken as c(2, 8) = 1.2) give the same head 1.875x. Load 32:
    K=3, 2.25 / 1.701 = 1.32x."""
    advice = sa.from_rule([0.6, 0.4, 0.25], size=TargetSize(30.5e9, 3.3e9))
    assert advice.inputs["step_costs_class"] == "Qwen3-30B-A3B (MoE)"
    at1, at8, at32 = advice.at(1), advice.at(8), advice.at(32)
    assert at1 is not None and at8 is not None and at32 is not None
    assert (at1.num_speculative_tokens, round(at1.speedup, 3)) == (3, 1.445)
    assert at8.num_speculative_tokens == 0 and 8 in advice.does_not_pay()
    assert (at32.num_speculative_tokens, round(at32.speedup, 2)) == (3, 1.32)
    dense = sa.from_rule([0.6, 0.4, 0.25], size=target_size(LLAMA_8B)).at(8)
    assert dense is not None and (dense.num_speculative_tokens, round(dense.speedup, 3)) == (3, 1.875)


def test_a_step_cost_under_one_plain_step_is_taken_as_one():
    """The Kimi class measured c(1, 32) = 0.98 (timing noise: a verify step does a plain step's work
    and more). Taken as it is, it would advise K=1 for a head that accepts 3% of its drafts."""
    kimi = sa.step_cost_class(TargetSize(1.03e12, 3.29e10))
    assert kimi.costs[32][1] < 1.0
    assert sa.cost(1, 32, kimi.costs) == 1.0
    assert sa.cost(3, 32, kimi.costs) == pytest.approx(1.18)
    advice = sa.from_rule([0.03], size=TargetSize(1.03e12, 3.29e10))
    assert advice.pays_off() == []


def test_a_kimi_sized_target_takes_the_class_of_its_active_path():
    """Kimi-K2.5: ~1T parameters, ~32.9B through which a token runs. Its nearest class is the one
    measured on its architecture's active path (61 layers, MLA, 8 experts all active: 32.7B)."""
    kimi = TargetSize(1.03e12, 3.29e10)
    assert sa.step_cost_class(kimi).name.startswith("DeepSeek-V3 architecture, 32.7B active")
    assert sa.step_cost_class(TargetSize(8.03e9, 8.03e9)).name == "Llama-3.1-8B"


def test_the_lines_train_and_export_print_read_the_export_as_it_lies(tmp_path):
    """export_serving_lines: target, trained K, TP and remote code from the export's own files, the
    acceptance from the file train.py names (or the export's acceptance.json), the size class from
    the local target directory train.py used (the export names the hub id, not a directory here)."""
    export = _export(tmp_path, 0)
    config = {"speculators_config": {"verifier": {"name_or_path": "org/llama"},
                                     "proposal_methods": [{"speculative_tokens": 3}]}}  # fmt: skip
    (export / "config.json").write_text(json.dumps(config))
    (export / "eagle3_meta.json").write_text(
        json.dumps({"serve_tensor_parallel_size": 2, "serve_trust_remote_code": True})
    )
    # no acceptance anywhere: the trained K, no verdict
    first, second = sc.export_serving_lines(export)
    assert first.startswith("serve it: vllm serve org/llama --tensor-parallel-size 2 --trust-remote-code")
    assert '"num_speculative_tokens": 3' in first and "serving advice: none" in second
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(LLAMA_8B))
    measured = tmp_path / "acceptance.json"
    measured.write_text(json.dumps({"per_position_acceptance_rate": RATES}))
    first, per_load, verdict = sc.export_serving_lines(export, measured, target_dir=target)
    # worked by hand in test_the_advice_for_an_8b_target_uses_the_8b_class_worked_by_hand: K=3 everywhere
    assert first.startswith("serve it: vllm serve org/llama --tensor-parallel-size 2 --trust-remote-code")
    assert "1: K=3 (1.90x)" in per_load and "the Llama-3.1-8B class (target: 8.03B parameters;" in per_load
    assert verdict == "the head pays off at 1, 8, 32, 64 concurrent requests"
    # written as serving.json for these weights: export.py's later report reads it back alone
    assert sc.export_serving_lines(export)[1] == per_load


def test_a_step_with_more_drafts_is_taken_no_cheaper_than_one_with_fewer():
    """The Kimi class measured c(3, 8) = 0.999 in a run before the warm-up, under its warmed
    c(2, 8) = 1.259: a verify step with 3 drafts does all the work of one with 2 and more. Taken as
    it is, K=3 at 8 requests would look 26% cheaper than K=2 and be advised for a weak head."""
    kimi = sa.step_cost_class(TargetSize(1.03e12, 3.29e10))
    assert kimi.costs[8][3] < kimi.costs[8][2]
    assert sa.cost(3, 8, kimi.costs) == pytest.approx(kimi.costs[8][2])
    assert sa.cost(5, 8, kimi.costs) == pytest.approx(kimi.costs[8][5])  # above both: as measured
    # by hand: a_j = 0.25 / 0.05 / 0.01: K=1 1.25/1.1 = 1.136x, K=2 1.30/1.259 = 1.033x,
    # K=3 1.31/1.259 = 1.041x (1.31/1.0 = 1.31x if 0.999 were taken): K=1 is advised at 8
    at8 = sa.from_rule([0.25, 0.05, 0.01], size=TargetSize(1.03e12, 3.29e10)).at(8)
    assert at8 is not None and (at8.num_speculative_tokens, round(at8.speedup, 3)) == (1, 1.136)
    # between measured K the fitted line, and never below a measured smaller K
    table = {1: {1: 1.5, 3: 1.2}}
    assert sa.cost(2, 1, table) >= 1.5 and sa.cost(3, 1, table) == pytest.approx(1.5)


def _acceptance(point: list[float], lower: list[float] | None, in_distribution: list[float]) -> dict:
    """acceptance.json as eagle3/evaluation/report.py writes it: the held-out suite's figures at the
    top level with their interval's lower end, the validation split beside them."""
    return {
        "headline": {"label": "held-out suite", "sets": ["broad", "math_word", "humaneval"]},
        "per_position_acceptance_rate": point,
        "per_position_acceptance_rate_lower": lower,
        "in_distribution": {
            "label": "validation split (in-distribution)",
            "per_position_acceptance_rate": in_distribution,
        },
    }


def test_a_head_strong_in_distribution_and_weak_on_the_suite_is_advised_off(tmp_path):
    """Validation acceptance 0.80 / 0.65 / 0.50 pays at every load at the smallest class's costs;
    the held-out suite's point figure pays at 1 and 32; its lower bound pays nowhere. The advice
    follows the lower bound: the target alone at every load, where the costs say so."""
    costs = sa.step_cost_class(None).costs
    high, point, lower = [0.8, 0.65, 0.5], [0.62, 0.45, 0.3], [0.45, 0.25, 0.12]
    assert sa.from_rule(high, costs).pays_off() == [1, 8, 32, 64]
    assert sa.from_rule(point, costs).pays_off() == [1, 32]
    for load in sa.ADVICE_LOADS:  # by hand: no K reaches the rule's floor at the lower bound
        best = max((1 + sum(lower[:k])) / sa.cost(k, load, costs) for k in (1, 2, 3))
        assert best < sa.MIN_SPEEDUP["rule"]
    export = _export(tmp_path, 0)
    advice = sa.advice_for(export, _acceptance(point, lower, high))
    assert advice is not None and advice.source == "rule" and advice.does_not_pay() == [1, 8, 32, 64]
    assert advice.inputs["acceptance"] == "held-out suite: lower end of the 95% interval"
    assert advice.inputs["per_position_acceptance_rate"] == lower
    first, _, verdict = sc.serving_lines(export, "org/target", 3, advice)
    assert first.startswith("serve it: vllm serve org/target (with the head:")
    assert verdict.endswith("at 1, 8, 32, 64 serve the target alone (vllm serve org/target)")
    # an acceptance.json without an interval (a vLLM without per-request figures): the point
    # figures, and the advice says so
    fallback = sa.advice_for(_export(tmp_path, 1), _acceptance(point, None, high))
    assert fallback is not None and fallback.pays_off() == [1, 32]
    assert fallback.inputs["acceptance"] == "held-out suite: point estimate (no interval)"


def test_a_measured_slowdown_at_a_load_overrides_the_rule(tmp_path):
    """serving.json measured at load 1 only (natural EOS): 0.92x at K=2, 0.88x at K=3. The rule on
    acceptance predicts more than 1 there; the measurement wins at 1, the rule fills 8, 32, 64 at
    the measurement's own step costs."""
    export = _export(tmp_path, 0)
    costs = {1: {2: 1.3, 3: 1.4}}
    measured = sa.from_measurements({1: {2: 0.92, 3: 0.88}}, step_costs={str(k): v for k, v in costs.items()})
    measured.head_sha256 = sa.head_sha256(export)
    measured.write(export)
    rates = [0.7, 0.5, 0.35]
    assert sa.from_rule(rates, costs, loads=(1,)).at(1).num_speculative_tokens > 0  # the rule says it pays
    advice = sa.advice_for(export, _acceptance(rates, rates, rates))
    assert advice is not None and [a.load for a in advice.loads] == [1, 8, 32, 64]
    at1 = advice.at(1)
    assert (at1.num_speculative_tokens, at1.speedup, at1.basis) == (0, 1.0, "measured")
    rule = sa.from_rule(rates, costs, loads=(8, 32, 64))
    for load in (8, 32, 64):
        assert advice.at(load) == rule.at(load) and advice.at(load).basis == "predicted"
    assert advice.inputs["predicted_loads"] == [8, 32, 64]
    _, per_load, _ = sc.serving_lines(export, "org/target", 3, advice)
    assert "measured by python evaluate.py serving.measure=true; predicted at 8, 32, 64" in per_load
    assert per_load.split("K per load: ")[1].startswith("1: none")
