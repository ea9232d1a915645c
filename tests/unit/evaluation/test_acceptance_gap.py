"""The acceptance gap between two heads (eagle3/evaluation/gap.py), on synthetic acceptance.json
dicts made from per-prompt figures: exact where the gap is known by hand, zero for one head
against itself, above zero for a head better on every prompt, blind to the order of the
entries, refused for reports of different prompts or settings, and point gaps with the reason
where a report has no per-prompt figures; bench/acceptance_gap.py prints and writes it."""

from __future__ import annotations

import importlib.util
import json
import random

import pytest
from conftest import ROOT
from helpers.acceptance_reports import HEADLINE, K, Turn, acceptance_json

from eagle3.evaluation.gap import acceptance_gap

# the hand case: A and B on two broad prompts (p2 has two turns), one math word problem, one val prompt
HAND_A = {
    ("broad", "p1"): [(10, [5, 2, 1])],
    ("broad", "p2"): [(6, [2, 1, 0]), (4, [1, 0, 0])],  # the unit: (10, [3, 1, 0])
    ("math_word", "m1"): [(5, [1, 0, 0])],
    ("val", "v1"): [(4, [2, 1, 0])],
}
HAND_B = {
    ("broad", "p1"): [(10, [6, 3, 2])],
    ("broad", "p2"): [(6, [3, 1, 1]), (4, [1, 1, 0])],  # the unit: (10, [4, 2, 1])
    ("math_word", "m1"): [(5, [2, 1, 0])],
    ("val", "v1"): [(4, [3, 2, 1])],
}


def _random_prompts(n: int, seed: int) -> dict[tuple[str, str], list[Turn]]:
    rng = random.Random(seed)
    prompts = {}
    for i in range(n):
        source = ("broad", "math_word", "val")[i % 3]
        turns = []
        for _ in range(1 + (i % 4 == 0)):
            drafts = rng.randint(5, 40)
            first = rng.randint(0, drafts - 1)  # below drafts: room for a better head
            second = rng.randint(0, first)
            turns.append((drafts, [first, second, rng.randint(0, second)]))
        prompts[(source, f"{source}-{i:02d}")] = turns
    return prompts


def within(x: float, interval: list[float]) -> bool:
    """x inside an interval as gap.py gives it (rounded to 4 decimals)."""
    return interval[0] - 1e-4 <= x <= interval[1] + 1e-4


def test_the_hand_case_gives_the_gap_known_exactly():
    gap = acceptance_gap(acceptance_json(HAND_A), acceptance_json(HAND_B))
    assert list(gap["sets"]) == ["held_out", "broad", "math_word", "val"] and gap["no_interval_reason"] is None
    held = gap["sets"]["held_out"]
    # A: 1 + (9 + 3 + 1) / 25 = 1.52; B: 1 + (12 + 6 + 3) / 25 = 1.84
    assert held["sets"] == HEADLINE and held["prompts"] == 3
    assert held["a"]["mean_acceptance_length"] == pytest.approx(1.52)
    assert held["b"]["mean_acceptance_length"] == pytest.approx(1.84)
    assert held["gap"] == pytest.approx(0.32) and held["relative_gap"] == pytest.approx(1.84 / 1.52 - 1)
    assert held["per_position_gap"] == pytest.approx([3 / 25, 3 / 25, 2 / 25])
    broad = gap["sets"]["broad"]  # A 1 + 12 / 20 = 1.6, B 1 + 18 / 20 = 1.9 (p2's two turns summed)
    assert broad["prompts"] == 2 and broad["gap"] == pytest.approx(0.3)
    assert broad["relative_gap"] == pytest.approx(0.1875) and broad["per_position_gap"] == pytest.approx([0.1] * 3)
    for figures in (held, broad):
        assert within(figures["gap"], figures["gap_interval"]) and figures["no_interval_reason"] is None
        assert within(figures["relative_gap"], figures["relative_gap_interval"])
        assert all(map(within, figures["per_position_gap"], figures["per_position_gap_interval"]))
    assert broad["gap_interval"] == [0.3, 0.3]  # each broad prompt's own gap is 0.3: so is every resample's
    # one prompt has no spread to resample: the point gap, no interval, and why
    for one in ("math_word", "val"):
        assert gap["sets"][one]["gap_interval"] is None and "under two" in gap["sets"][one]["no_interval_reason"]
    assert gap["sets"]["val"]["gap"] == pytest.approx((1 + 6 / 4) - (1 + 3 / 4))


def test_one_head_against_itself_gives_a_zero_gap_and_an_interval_holding_zero():
    report = acceptance_json(_random_prompts(30, seed=1))
    gap = acceptance_gap(report, report)
    for figures in gap["sets"].values():
        assert figures["gap"] == 0 and figures["relative_gap"] == 0 and figures["per_position_gap"] == [0] * K
        lo, hi = figures["gap_interval"]
        assert lo <= 0 <= hi
        lo, hi = figures["relative_gap_interval"]
        assert lo <= 0 <= hi


def test_a_head_better_on_every_prompt_gives_an_interval_above_zero():
    a = _random_prompts(30, seed=2)
    b = {key: [(d, [acc[0] + 1, *acc[1:]]) for d, acc in turns] for key, turns in a.items()}
    gap = acceptance_gap(acceptance_json(a), acceptance_json(b))
    for figures in gap["sets"].values():
        assert figures["gap"] > 0 and figures["gap_interval"][0] > 0 and figures["relative_gap_interval"][0] > 0
        assert figures["per_position_gap_interval"][0][0] > 0
        assert figures["per_position_gap"][1:] == [0, 0]


def test_the_prompts_are_paired_not_read_in_order():
    a, b = _random_prompts(24, seed=3), _random_prompts(24, seed=4)
    ra, rb = acceptance_json(a), acceptance_json({key: b[ka] for key, ka in zip(a, b)})
    shuffled = acceptance_json({key: b[ka] for key, ka in zip(a, b)})
    random.Random(5).shuffle(shuffled["per_prompt"])
    assert acceptance_gap(ra, shuffled) == acceptance_gap(ra, rb)
    # the heads swapped: the opposite gap
    back = acceptance_gap(rb, ra)["sets"]["held_out"]
    assert back["gap"] == pytest.approx(-acceptance_gap(ra, rb)["sets"]["held_out"]["gap"])


def test_reports_of_different_prompts_or_settings_are_refused():
    a = acceptance_json(HAND_A)
    with pytest.raises(ValueError, match=r"num_draft_tokens differs: A 3, B 5"):
        acceptance_gap(a, acceptance_json({k: [(d, acc + [0, 0]) for d, acc in t] for k, t in HAND_B.items()}, k=5))
    with pytest.raises(ValueError, match=r"max_new_tokens differs: A 64, B 128"):
        acceptance_gap(a, acceptance_json(HAND_B, max_new_tokens=128))
    fewer = {k: v for k, v in HAND_B.items() if k != ("broad", "p1")}
    with pytest.raises(ValueError, match=r"A has 4 prompt units, B 3; only in A: broad/p1"):
        acceptance_gap(a, acceptance_json(fewer))
    other = {**fewer, ("broad", "p9"): [(3, [1, 0, 0])]}
    with pytest.raises(ValueError, match=r"only in A: broad/p1; only in B: broad/p9"):
        acceptance_gap(a, acceptance_json(other))
    one_turn = {**HAND_B, ("broad", "p2"): [(10, [4, 2, 1])]}
    with pytest.raises(
        ValueError, match=r"turns of 1 prompt\(s\) differ, e.g. broad/p2: A turns \[1, 2\], B turns \[1\]"
    ):
        acceptance_gap(a, acceptance_json(one_turn))
    with pytest.raises(ValueError, match="headline sets differ"):
        acceptance_gap(a, acceptance_json(HAND_B, headline_sets=["broad"]))


def test_validation_splits_of_other_prompts_are_left_out_not_refused():
    """Two arms that each answered their own conversations have other validation splits: the held-out
    sets are paired as ever, the split is left out, each head's own figure there kept with the reason."""
    own_val = {k: v for k, v in HAND_B.items() if k[0] != "val"} | {("val", "v2"): [(4, [3, 2, 1])]}
    a, b = acceptance_json(HAND_A), acceptance_json(own_val)
    gap = acceptance_gap(a, b)
    alike = acceptance_gap(
        acceptance_json({k: v for k, v in HAND_A.items() if k[0] != "val"}),
        acceptance_json({k: v for k, v in HAND_B.items() if k[0] != "val"}),
    )
    assert "val" not in gap["sets"] and gap["sets"] == alike["sets"]
    apart = gap["validation_apart"]
    assert "1 and 1 units, 0 shared" in apart["why"]
    assert apart["A"] == a["in_distribution"]["mean_acceptance_length"]
    assert apart["B"] == b["in_distribution"]["mean_acceptance_length"]
    assert "validation_apart" not in acceptance_gap(a, acceptance_json(HAND_B))  # the same split: paired


def test_without_per_request_figures_the_point_gaps_come_from_the_counters_with_the_reason():
    paired = acceptance_gap(acceptance_json(HAND_A), acceptance_json(HAND_B))
    for a_per_request in (False, True):  # neither report has them, or B alone lacks them
        a = acceptance_json(HAND_A, per_request=a_per_request)
        gap = acceptance_gap(a, acceptance_json(HAND_B, per_request=False))
        reason = gap["no_interval_reason"]
        assert "no per-prompt figures" in reason and "eval.prompts_apart=true" in reason
        assert ("A and B: " in reason) is (not a_per_request) and "B: engine.per_request_figures is false" in reason
        assert gap["method"] == f"n/a: {reason}"
        assert list(gap["sets"]) == list(paired["sets"])
        for name, figures in gap["sets"].items():
            assert figures["gap_interval"] is None and figures["relative_gap_interval"] is None
            assert figures["per_position_gap_interval"] is None and figures["no_interval_reason"] == reason
            assert figures["prompts"] == paired["sets"][name]["prompts"]
            for key in ("gap", "relative_gap", "per_position_gap"):
                assert figures[key] == pytest.approx(paired["sets"][name][key]), (name, key)
    # drafts 0 in every entry says it too, where the engine's flag is missing
    a, b = acceptance_json(HAND_A, per_request=False), acceptance_json(HAND_B, per_request=False)
    a["engine"].pop("per_request_figures"), b["engine"].pop("per_request_figures")
    assert "every per_prompt entry has drafts 0" in acceptance_gap(a, b)["no_interval_reason"]


def test_the_bench_prints_the_table_writes_the_json_and_refuses_with_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("acceptance_gap_bench", ROOT / "bench" / "acceptance_gap.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    paths = {}
    for name, prompts, per_request in (("a", HAND_A, True), ("b", HAND_B, True), ("c", HAND_B, False)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(acceptance_json(prompts, per_request=per_request)))
    out = tmp_path / "gap.json"
    assert bench.main([str(paths["a"]), str(paths["b"]), "--names", "old", "new", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| set | prompts | old | new | new - old [95%] | relative [95%] |" in table
    assert "| held-out suite | 3 | 1.520 | 1.840 | +0.320 [" in table and "+21.1% [" in table
    saved = json.loads(out.read_text())
    assert saved["names"] == ["old", "new"] and saved["reports"] == {"old": str(paths["a"]), "new": str(paths["b"])}
    assert saved["sets"]["held_out"]["gap"] == pytest.approx(0.32)
    # no per-prompt figures in one: the point gaps, "n/a" and why
    assert bench.main([str(paths["a"]), str(paths["c"])]) == 0
    table = capsys.readouterr().out
    assert "+0.320 [n/a]" in table and "intervals: n/a: no per-prompt figures (B: " in table
    assert "eval.prompts_apart=true" in table
    # other prompts: refused, saying what differs and which file is which
    paths["d"] = tmp_path / "d.json"
    paths["d"].write_text(json.dumps(acceptance_json({**HAND_B, ("broad", "p9"): [(3, [1, 0, 0])]})))
    assert bench.main([str(paths["a"]), str(paths["d"])]) == 2
    err = capsys.readouterr().err
    assert "only in B: broad/p9" in err and f"B: {paths['d']}" in err
    # the served targets each head was measured against: said where they differ, and where both are quantized
    for name, quantization in (("a", None), ("b", "fp8"), ("e", "fp8")):
        report = acceptance_json(HAND_A if name == "a" else HAND_B)
        report["engine"]["quantization"] = quantization
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(report))
    assert bench.main([str(paths["a"]), str(paths["b"]), "--names", "bf16", "fp8"]) == 0
    assert "the targets differ (bf16 against unquantized, fp8 against fp8)" in capsys.readouterr().out
    assert bench.main([str(paths["b"]), str(paths["e"])]) == 0
    table = capsys.readouterr().out
    assert "both against the target served as fp8" in table and "targets differ" not in table
    assert acceptance_gap(json.loads(paths["a"].read_text()), json.loads(paths["b"].read_text()))["targets"] == [
        None,
        "fp8",
    ]
