"""Generation to compare with: transformers' generate() on one prompt alone."""

from __future__ import annotations

import torch


def generate_alone(model, prompt: list[int], room: int, stop: set[int], **kwargs) -> list[int]:
    """Greedy generate() of ``prompt`` alone (no batch, no padding): at most ``room`` new tokens,
    cut after the first of ``stop``; ``kwargs`` more generate() settings."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=room,
            do_sample=False,
            pad_token_id=0,
            **kwargs,
        )
    seq = out[0, len(prompt) :].tolist()[:room]
    return seq[: next((k for k, t in enumerate(seq) if t in stop), len(seq))]
