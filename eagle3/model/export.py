"""The serving format: weight names and config.json that speculators 0.9 and vLLM 0.32 load.

Weights (vLLM llama_eagle3 `load_weights` + speculators Eagle3DraftModel):
    fc.weight, layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.mlp.{gate,up,down}_proj.weight,
    layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight, norm.weight,
    lm_head.weight, d2t, t2d, [input_norm.weight if norm_before_fc],
    [fc_norm.{i}.weight for each aux layer i if fc_norm], [embed_tokens.weight];
    with num_layers > 1 also layers.i.{self_attn.*, mlp.*, input_layernorm, post_attention_layernorm}
    for i >= 1 (no hidden_norm: those layers see the hidden stream only).
Our module uses the same names; the frozen target copies (target_norm, target_lm_head) are
training-only and never exported (speculators drops its verifier_* copies the same way).

config.json: what speculators' Eagle3SpeculatorConfig serialises (checked in
tests/test_model_parity.py), with the norm flags vLLM reads (config.NORM_OPTIONS) written
from the head's config. vLLM assumes norm_before_residual=True when the key is missing, so
every flag is always written.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eagle3.model.config import DraftConfig

SPECULATORS_VERSION = "0.9.0"
_TRAINING_ONLY_PREFIXES = ("target_norm.", "target_lm_head.")


def export_state_dict(
    head: nn.Module, *, include_embed_tokens: bool = False, dtype: torch.dtype | None = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """The head's weights under serving names, contiguous CPU tensors (float ones cast to dtype).

    d2t (int64) and t2d (bool) keep their dtypes. embed_tokens is the target's own (frozen)
    copy, so it is left out unless it was trained (vLLM then shares the target's).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in head.state_dict().items():
        if name.startswith(_TRAINING_ONLY_PREFIXES):
            continue
        if name.startswith("embed_tokens.") and not include_embed_tokens:
            continue
        t = tensor.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.contiguous()
    return out


def load_export_state_dict(head: nn.Module, weights: dict[str, torch.Tensor], where: str) -> None:
    """The reverse of export_state_dict: copy an export's tensors into `head` (float ones as
    fp32). Refuses a tensor the head lacks, a trained one the export lacks, and a wrong shape,
    naming `where` (the file) in the error; the frozen target copies may be absent."""
    cast = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
    try:
        missing, unexpected = head.load_state_dict(cast, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise ValueError(f"{where}: {str(e).splitlines()[-1].strip()}") from e
    frozen = {n for n, p in head.named_parameters() if not p.requires_grad} | {n for n, _ in head.named_buffers()}
    if unexpected or set(missing) - frozen:
        raise ValueError(f"{where} (missing {sorted(set(missing) - frozen)[:5]}, unexpected {unexpected[:5]})")


def transformer_layer_config_dict(cfg: DraftConfig) -> dict[str, Any]:
    """The Llama decoder-layer config (transformers-5 keys) vLLM builds the draft layer from."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "num_hidden_layers": cfg.num_layers,
        "vocab_size": cfg.target_vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": cfg.rope_parameters,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": cfg.initializer_range,
    }


def speculators_config_dict(
    draft_cfg: DraftConfig,
    aux_layer_ids: list[int],
    verifier_name_or_path: str,
    num_speculative_tokens: int,
    *,
    verifier_architectures: list[str] | None = None,
) -> dict[str, Any]:
    """config.json for the export directory.

    aux_layer_ids: vLLM numbering (id k = state entering decoder layer k), exactly what
    vLLM's `eagle_aux_hidden_state_layer_ids` means.
    """
    aux_layer_ids = [int(i) for i in aux_layer_ids]
    if len(aux_layer_ids) != draft_cfg.num_aux_layers:
        raise ValueError(
            f"speculators_config_dict: {len(aux_layer_ids)} aux layer ids {aux_layer_ids} but the draft "
            f"was built for num_aux_layers={draft_cfg.num_aux_layers}"
        )
    if num_speculative_tokens < 1:
        raise ValueError(f"speculators_config_dict: num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": transformer_layer_config_dict(draft_cfg),
        "draft_vocab_size": draft_cfg.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": aux_layer_ids,
        **draft_cfg.norm_options,
        "embed_requires_grad": False,
        "target_hidden_size": None,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(num_speculative_tokens),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {
                "name_or_path": str(verifier_name_or_path),
                "architectures": list(verifier_architectures or []),
            },
        },
    }
