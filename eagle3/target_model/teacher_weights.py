"""The target's final norm and lm_head, as capture.teacher_topk's projection needs them
(eagle3/store/teacher_topk.py does the math): (norm weight [H], rms_norm_eps, lm_head [Vt, H]).

The HF capture has the base model in memory: its final norm and, when the model ties them, its
embeddings are the lm_head, used in place (no second copy); an untied lm_head (not part of the base
model transformers loads) is read from the weights alone. The vLLM capture's model lives in vLLM's
process: the two tensors are read from the safetensors directory vLLM serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch

from eagle3.target_model.records import CaptureError
from eagle3.target_model.resolve import load_target_head_weights, read_hf_config

TeacherWeights = tuple[torch.Tensor, float, torch.Tensor]  # norm weight [H], eps, lm_head [Vt, H]


def rms_norm_eps(target_dir: str | Path) -> float:
    """The target's final-norm eps, from its config.json (the text config of a multimodal one)."""
    cfg = read_hf_config(target_dir)
    eps = cfg.get("rms_norm_eps")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise CaptureError(f"{Path(target_dir) / 'config.json'} rms_norm_eps", "a number > 0", eps)
    return float(eps)


def weights_from_files(target_dir: str | Path, device: torch.device | str = "cpu") -> TeacherWeights:
    """The final norm and lm_head (the embeddings when tied) read from ``target_dir``, on ``device``."""
    w = load_target_head_weights(target_dir, ("norm", "lm_head"))
    return w["norm"].to(device), rms_norm_eps(target_dir), w["lm_head"].to(device)


def weights_from_model(model: Any, target_dir: str | Path) -> TeacherWeights:
    """The final norm and lm_head of a transformers base model in memory, on its device: its own
    tensors (the input embeddings when tied); an untied lm_head read from ``target_dir``."""
    norm = _final_norm(model)
    text = model.config.get_text_config()
    tied = bool(getattr(text, "tie_word_embeddings", getattr(model.config, "tie_word_embeddings", False)))
    weight = cast(torch.Tensor, norm.weight).detach()
    if tied:
        lm_head = model.get_input_embeddings().weight.detach()
    else:
        lm_head = load_target_head_weights(target_dir, ("lm_head",))["lm_head"].to(weight.device, weight.dtype)
    return weight, rms_norm_eps(target_dir), lm_head


def _final_norm(model: Any) -> torch.nn.Module:
    """The base model's final norm (after the last decoder layer)."""
    for path in ("norm", "language_model.norm", "model.norm", "decoder.norm"):
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.nn.Module) and isinstance(getattr(obj, "weight", None), torch.Tensor):
            return obj
    raise CaptureError(
        f"{type(model).__name__} final norm",
        "a norm with a weight at .norm, .language_model.norm, .model.norm or .decoder.norm",
        "none found",
    )
