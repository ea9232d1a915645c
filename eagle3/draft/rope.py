"""Rotary position embedding for the draft layer, same formulas as transformers and vLLM.

Written out (not borrowed from transformers) so the head works across transformers 4.x
(rope_scaling) and 5.x (rope_parameters) alike; only the rope types DraftConfig accepts.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from eagle3.draft.config import DraftConfig


def inverse_frequencies(cfg: DraftConfig) -> torch.Tensor:
    dim = int(cfg.head_dim)  # type: ignore[arg-type]
    # fp32 like transformers and vLLM, so the frequencies agree bit for bit
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling or {}
    if cfg.rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif cfg.rope_type == "llama3":
        factor = float(scaling["factor"])
        low_freq_factor = float(scaling["low_freq_factor"])
        high_freq_factor = float(scaling["high_freq_factor"])
        old_context = float(scaling["original_max_position_embeddings"])
        low_freq_wavelen = old_context / low_freq_factor
        high_freq_wavelen = old_context / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths are slowed by `factor`, short ones kept, the band between blended
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        inv_freq = torch.where(medium, blended, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    inv_freq: torch.Tensor  # a buffer

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.register_buffer("inv_freq", inverse_frequencies(cfg), persistent=False)

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [B, T] -> (cos, sin) [B, T, head_dim], computed in fp32."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, head_dim]; cos/sin [B, T, head_dim]."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin
