"""The preallocated-cache decoder on the real SmolLM2 in float32 answers exactly as generate() does
alone."""

from __future__ import annotations

import pytest
import torch
from helpers.generate import generate_alone

from eagle3.target_model.generate.fast_decode import decode


@pytest.mark.slow
def test_smollm2_float32_equals_generate_alone(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}],
        [{"role": "user", "content": "Write a short poem about the sea, in three lines, and explain it. " * 3}],
    ]
    prompts = []
    for chat in chats:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    assert len({len(p) for p in prompts}) == 3
    stop = {tok.eos_token_id}
    want = [generate_alone(model, p, 24, stop, eos_token_id=sorted(stop)) for p in prompts]
    got = decode(model, prompts, [24] * 3, stop)
    assert got == want
    assert "Paris" in tok.decode(got[0])
