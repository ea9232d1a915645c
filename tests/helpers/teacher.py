"""The teacher's projection (final norm + lm_head -> top-k) of a small random target, and final
states for it."""

from __future__ import annotations

import torch

from eagle3.store.teacher_topk import TeacherProjection

# the states' captured layer ids; hidden size, target vocabulary, top-k
LAYER_IDS = (1, 2, 4)
H, V, K = 64, 300, 8
DT = torch.bfloat16
INPUTS = {"model": "tiny", "layer_ids": list(LAYER_IDS), "dtype": "bfloat16"}


def teacher_projection(k: int = K, seed: int = 0, chunk_tokens: int = 5) -> TeacherProjection:
    g = torch.Generator().manual_seed(seed)
    norm = (1 + 0.1 * torch.randn(H, generator=g)).to(DT)
    lm_head = (torch.randn(V, H, generator=g) / H**0.5).to(DT)
    return TeacherProjection(norm, 1e-5, lm_head, k, chunk_tokens=chunk_tokens, vocab_block=128)


def teacher_states(T: int, seed: int = 0) -> torch.Tensor:
    """[T, L, H] random states, the last layer the final one the projection reads."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, len(LAYER_IDS), H, generator=g) * 3).to(DT)
