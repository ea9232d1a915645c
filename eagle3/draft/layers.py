"""Building blocks of the draft head: RMSNorm, attention over the TTT keys, MLP, the
EAGLE-3 decoder layer whose attention input is concat(embeddings, hidden) = 2H, and the plain
layers that may follow it.

Parameter names follow speculators / vLLM llama_eagle3 (`self_attn.q_proj`, `mlp.gate_proj`,
`input_layernorm`, `hidden_norm`, `post_attention_layernorm`) so export is a plain copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from eagle3.draft.config import DraftConfig
from eagle3.draft.flex import flex_attend
from eagle3.draft.rope import apply_rotary

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, normalised in fp32 (as Llama, vLLM)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class TTTAttention(nn.Module):
    """Grouped-query attention whose keys/values accumulate over TTT steps."""

    def __init__(self, cfg: DraftConfig, input_size: int):
        super().__init__()
        hd = int(cfg.head_dim)  # type: ignore[arg-type]
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = hd
        self.q_proj = nn.Linear(input_size, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, input_size]
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_keys: list[torch.Tensor],  # per earlier TTT step: [B, kv_heads, T, hd]; appended to
        past_values: list[torch.Tensor],
        # bool [B, 1, T, T * (len(past_keys) + 1)], or a flex BlockMask (eagle3/draft/flex.py)
        mask: torch.Tensor | BlockMask,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        past_keys.append(k)
        past_values.append(v)
        if not isinstance(mask, torch.Tensor):  # block-sparse flex attention (GQA in the kernel)
            out = flex_attend(q, past_keys, past_values, mask, enable_gqa=self.num_kv_heads != self.num_heads)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))
        keys = torch.cat(past_keys, dim=2) if len(past_keys) > 1 else k
        values = torch.cat(past_values, dim=2) if len(past_values) > 1 else v
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            keys = keys.repeat_interleave(rep, dim=1)
            values = values.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _DecoderBlock(nn.Module):
    """What every draft layer has: input_layernorm, attention over the TTT keys (input
    ``attention_input`` wide), post_attention_layernorm and the MLP; the layers differ only in
    what they feed the attention and keep as its residual."""

    def __init__(self, cfg: DraftConfig, attention_input: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = TTTAttention(cfg, input_size=attention_input)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def _attend_then_mlp(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        mask: torch.Tensor | BlockMask,
    ) -> torch.Tensor:
        h = residual + self.self_attn(x, cos, sin, past_keys, past_values, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3DecoderLayer(_DecoderBlock):
    """attention(concat(input_layernorm(embeds), hidden_norm(hidden))) + residual, then MLP.

    The residual is the un-normalised hidden half (or its normalised form when
    cfg.norm_before_residual), as in speculators' Eagle3FirstLayerMixin and vLLM.
    """

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg, attention_input=2 * cfg.hidden_size)
        self.norm_before_residual = cfg.norm_before_residual
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        normed_hidden = self.hidden_norm(hidden)
        residual = normed_hidden if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1)
        return self._attend_then_mlp(x, residual, cos, sin, past_keys, past_values, mask)


class DraftDecoderLayer(_DecoderBlock):
    """A layer after the first (num_layers > 1): pre-norm Llama over the hidden stream, input H.

    vLLM's llama_eagle3 layers with layer_idx > 0 and speculators' decoder_layer_class do the
    same: h + attn(input_layernorm(h)), then + mlp(post_attention_layernorm(.)).
    """

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg, attention_input=cfg.hidden_size)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        return self._attend_then_mlp(self.input_layernorm(hidden), hidden, cos, sin, past_keys, past_values, mask)
