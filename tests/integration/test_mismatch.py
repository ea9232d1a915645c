"""Greedy mismatches explained by an fp32 reference forward of the real SmolLM2: the verdict
names which token the target prefers and by how much, so a numerics flip (near tie) and a
real verification bug (a clearly worse token) read differently in the report."""

from __future__ import annotations

import pytest
import torch

from eagle3.evaluation.diagnostics.mismatch import NEAR_TIE_LOGITS, cases_from, explain


@pytest.mark.slow
def test_verdicts_name_the_preferred_token_and_the_gap(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
        add_generation_prompt=True,
        tokenize=True,
    )
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        greedy = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :].tolist()
        logits = model(torch.tensor([prompt + greedy[:5]])).logits[0, -1]
    order = logits.argsort(descending=True)
    best, second, far = int(order[0]), int(order[1]), int(order[-1])
    assert best == greedy[5]
    runner_up = greedy[:5] + [second]  # an engine that flipped to the runner-up at token 5
    nonsense = greedy[:5] + [far]  # an engine that picked the least likely token: a bug
    cases = cases_from(
        [prompt, prompt, prompt], ["flip", "bug", "same"], [runner_up, greedy, greedy], [greedy, nonsense, greedy]
    )
    assert [c.id for c in cases] == ["flip", "bug"]  # identical outputs are not a case
    flip, bug = explain(smollm2_dir, cases, device="cpu")
    assert flip.position == 5 and flip.reference_token == best == flip.without_head_token
    assert flip.logit_gap_fp32 == pytest.approx(float(logits[second] - logits[best]), abs=1e-3)
    assert flip.logit_gap_fp32 < 0
    assert bug.reference_token == bug.with_head_token and bug.logit_gap_fp32 > NEAR_TIE_LOGITS and not bug.near_tie
    assert "NOT a near tie" in bug.describe() and "with-head's" in bug.describe()
