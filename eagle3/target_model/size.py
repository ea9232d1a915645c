"""A target's size from its config.json alone: all parameters, and those active per token.

Serving cost follows the active parameters (a mixture of experts runs only the routed experts of
each token), memory and disk the whole. Counted from the shapes (embeddings, attention, MLP or
experts per layer); norms and biases are left out (well under 0.1%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TargetSize:
    params: float  # every weight
    active_params: float  # the weights one token runs through

    def describe(self) -> str:
        if abs(self.active_params - self.params) <= 0.01 * self.params:
            return f"{self.params / 1e9:.2f}B parameters"
        return f"{self.params / 1e9:.2f}B parameters, {self.active_params / 1e9:.2f}B active"


def _attention(hf: dict[str, Any], hidden: int) -> int:
    if not hf.get("num_attention_heads"):  # unknown: full multi-head attention (q, k, v, o of H x H)
        return 4 * hidden * hidden
    heads = int(hf["num_attention_heads"])
    if hf.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek-V3, Kimi)
        rope, nope, v = int(hf["qk_rope_head_dim"]), int(hf["qk_nope_head_dim"]), int(hf["v_head_dim"])
        q_rank, kv_rank = hf.get("q_lora_rank"), int(hf["kv_lora_rank"])
        q = hidden * heads * (nope + rope) if not q_rank else hidden * q_rank + q_rank * heads * (nope + rope)
        kv = hidden * (kv_rank + rope) + kv_rank * heads * (nope + v)
        return q + kv + heads * v * hidden
    head_dim = int(hf.get("head_dim") or hidden // heads)
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    return hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim


def _experts(hf: dict[str, Any]) -> tuple[int, int, int]:
    """(routed experts, experts per token, shared experts); (0, 0, 0) for a dense model."""
    routed = int(hf.get("num_experts") or hf.get("n_routed_experts") or hf.get("num_local_experts") or 0)
    if not routed:
        return 0, 0, 0
    return routed, int(hf.get("num_experts_per_tok") or 1), int(hf.get("n_shared_experts") or 0)


def target_size(hf: dict[str, Any]) -> TargetSize:
    """``hf``: a config.json's text part (eagle3.target_model.resolve.read_hf_config)."""
    hidden, layers, vocab = int(hf["hidden_size"]), int(hf["num_hidden_layers"]), int(hf["vocab_size"])
    embeddings = vocab * hidden * (1 if hf.get("tie_word_embeddings") else 2)
    attention = _attention(hf, hidden)
    dense_mlp = 3 * hidden * int(hf.get("intermediate_size") or 4 * hidden)
    routed, per_token, shared = _experts(hf)
    if not routed:
        total = embeddings + layers * (attention + dense_mlp)
        return TargetSize(float(total), float(total))
    expert = 3 * hidden * int(hf.get("moe_intermediate_size") or hf.get("intermediate_size") or 4 * hidden)
    dense_layers = int(hf.get("first_k_dense_replace") or 0)
    moe_layers = layers - dense_layers
    base = embeddings + layers * attention + dense_layers * dense_mlp + moe_layers * shared * expert
    return TargetSize(float(base + moe_layers * routed * expert), float(base + moe_layers * per_token * expert))


# a model preset's facts (conf/model's ModelConfig fields) under their config.json names
PRESET_FACTS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "vocab_size": "vocab_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
}


def preset_config(model: Any) -> dict[str, Any]:
    """The config.json fields a model preset states (``model``: conf/model's ModelConfig): its
    facts and its extra_config (experts, head_dim, MLA ranks, tied embeddings): what
    ``target_size`` reads, for a target that is not on this machine yet."""
    hf = {key: getattr(model, fact) for fact, key in PRESET_FACTS.items() if getattr(model, fact, None) is not None}
    return {**hf, **dict(getattr(model, "extra_config", None) or {})}
