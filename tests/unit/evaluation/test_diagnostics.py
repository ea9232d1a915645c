"""eval.diagnostics: off (the default), evaluate reports vLLM's acceptance and counts greedy
mismatches, and runs neither the fp32 verdicts nor the two train-side replays; on, it runs
all three. The vLLM engines are stood in for by fixed results (the real ones: test_evaluate)."""

from __future__ import annotations

import pytest

from eagle3.config.schema import EvalConfig
from eagle3.evaluation.counters import SpecDecodeCounters
from eagle3.evaluation.diagnostics.mismatch import MismatchVerdict
from eagle3.evaluation.engine_io import BatchResult, EngineRequest, EngineResult
from eagle3.evaluation.export_info import ExportInfo

K = 3


def _fake_engine(request: EngineRequest, work_dir, label):
    """Every request drafts 4 times and accepts 2 tokens (all at position 0); without the head,
    the second prompt of each source parts from the with-head output at its second token."""
    batches = []
    for b in request.batches:
        n = len(b.prompts)
        if request.head is not None:
            counters = SpecDecodeCounters(4 * n, 4 * K * n, 2 * n, [2 * n, 0, 0]).to_dict()
            batches.append(BatchResult(b.name, [[5, 6, 7, 8]] * n, 1.0, counters, [[2, 2, 0, 0]] * n))
        else:
            batches.append(BatchResult(b.name, [[5, 6, 7, 8] if i != 1 else [5, 9, 7] for i in range(n)], 2.0))
    return EngineResult("0.0", "cpu", True, 0.1, 0.0, batches), 1.0


@pytest.fixture
def harness(monkeypatch, smollm2_dir, tmp_path):
    """evaluate() on two HumanEval prompts with fake engines; returns the calls each diagnostic made."""
    import eagle3.evaluation.acceptance_run as acceptance_run
    import eagle3.evaluation.diagnostics.head_replay as replay_export
    import eagle3.evaluation.diagnostics.served_replay as served_replay
    import eagle3.evaluation.export_info as export_info

    calls: dict[str, list] = {"explain": [], "train_side": [], "served": []}
    info = ExportInfo(tmp_path / "export", str(smollm2_dir), [2, 15, 27], 8, None)

    def explain(target, cases, trust_remote_code=False):
        calls["explain"].append(cases)
        return [
            MismatchVerdict(c.id, len(c.prefix_ids), c.with_head_token, c.without_head_token, 0.1, 6, True)
            for c in cases
        ]

    def replay_for_prompts(*args, **kwargs):
        calls["train_side"].append(args)
        return None, "train-side replay skipped: no dataset"

    def replay_served(export_dir, target, served, **kwargs):
        calls["served"].append(served)
        return {"all": {"replay_accept_len": 1.5, "samples": 2.0}}, None

    monkeypatch.setattr(export_info, "read_export", lambda export_dir, target=None: info)
    monkeypatch.setattr(acceptance_run, "run_engine_process", _fake_engine)
    monkeypatch.setattr(acceptance_run, "explain", explain)
    monkeypatch.setattr(replay_export, "replay_for_prompts", replay_for_prompts)
    monkeypatch.setattr(served_replay, "replay_served", replay_served)
    return calls


def _evaluate(tmp_path, diagnostics: bool) -> dict:
    import json

    from eagle3.evaluation.acceptance import evaluate

    # HumanEval only (no suite prompts): the fake engine's outputs are written for two prompts
    cfg = EvalConfig(
        num_draft_tokens=K, max_prompts=2, humaneval_prompts=2, suite_prompts=0, math_prompts=0, diagnostics=diagnostics
    )
    result = evaluate(tmp_path / "export", eval_cfg=cfg, out_dir=tmp_path / "out", show_table=False)
    assert result.mean_acceptance_length == pytest.approx(1.5)  # vLLM's figure: 1 + 4 / 8, always
    return json.loads(result.json_path.read_text())


def test_diagnostics_are_off_by_default_and_mismatches_are_still_counted(harness, tmp_path):
    assert EvalConfig().diagnostics is False
    data = _evaluate(tmp_path, diagnostics=False)
    assert harness == {"explain": [], "train_side": [], "served": []}
    assert data["greedy_match_rate"] == pytest.approx(0.5)
    assert data["greedy_mismatches"] == [{"source": "humaneval", "id": "HumanEval/1", "first_difference": 1}]
    assert any("1 greedy mismatches not explained (eval.diagnostics=true" in n for n in data["prompt_notes"])
    assert data["train_side_replay"] == {} and data["served_replay"] == {}


def test_diagnostics_explain_mismatches_and_replay_the_head(harness, tmp_path):
    data = _evaluate(tmp_path, diagnostics=True)
    ((case,),) = harness["explain"]  # one fp32 forward, for the one mismatch
    assert (case.id, case.prefix_ids, case.with_head_token, case.without_head_token) == ("HumanEval/1", [5], 6, 9)
    (mismatch,) = data["greedy_mismatches"]
    assert mismatch["near_tie"] and mismatch["logit_gap_fp32"] == pytest.approx(0.1)
    assert len(harness["train_side"]) == 1 and "train-side replay skipped: no dataset" in data["prompt_notes"]
    ((source, pairs),) = harness["served"][0].items()  # what vLLM served with the head, per source
    assert source == "humaneval" and len(pairs) == 2 and pairs[0][1] == [5, 6, 7, 8]
    assert data["served_replay"]["all"]["replay_accept_len"] == pytest.approx(1.5)
