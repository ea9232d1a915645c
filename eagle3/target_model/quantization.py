"""The served target's quantization: what model.quantization asks of vLLM, what the checkpoint
carries itself, and the engine arguments every vLLM engine of a run takes from it.

A head is trained to predict the target it is served beside: an FP8 deployment's hidden states
and answers are not the bf16 checkpoint's. So the one value (``model.quantization``, the enum
``choices.Quantization``; its value is vLLM's name) reaches regeneration, capture, the acceptance
evaluation and the serving measurement through ``engine_kwargs``, and the ``vllm serve`` line
through ``serve_flags``. A checkpoint whose config.json carries a ``quantization_config`` is
served in that format whatever the flag says; vLLM reads it itself, so the flag may stay null
(``checkpoint_quantization`` finds it for the manifest and the card) and another flag is
refused before any engine starts (``served_quantization``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from eagle3.config.choices import Quantization

# formats vLLM reads from a checkpoint in that format; only fp8 is applied to a plain checkpoint
CHECKPOINT_ONLY = (Quantization.compressed_tensors, Quantization.awq, Quantization.gptq)


class QuantizationError(ValueError):
    pass


def vllm_name(quantization: Quantization | str | None) -> Optional[str]:
    """vLLM's name of a model.quantization value (the enum, its name or its value; None for null
    and ``none``: the checkpoint as it is)."""
    if quantization is None:
        return None
    if isinstance(quantization, Enum):
        return None if quantization is Quantization.none else str(quantization.value)
    text = str(quantization)
    for q in Quantization:
        if text in (q.name, q.value):
            return None if q is Quantization.none else str(q.value)
    raise QuantizationError(
        f"model.quantization: expected one of {[q.name for q in Quantization]} or null, got {text!r}"
    )


def engine_kwargs(quantization: Quantization | str | None) -> dict[str, Any]:
    """The LLM(...) arguments of the served target's quantization, the same for every engine of a
    run: ``{"quantization": <vLLM's name>}``, or nothing (vLLM then runs the checkpoint as it is,
    its own quantization_config included)."""
    name = vllm_name(quantization)
    return {"quantization": name} if name else {}


def serve_flags(quantization: Quantization | str | None) -> str:
    """The ``vllm serve`` flag of the same value (" --quantization fp8"), or ""."""
    name = vllm_name(quantization)
    return f" --quantization {name}" if name else ""


def hf_route_refusal(route: str, quantization: Quantization | str, instead: str) -> str:
    """Why a route that runs the target through transformers cannot serve ``quantization``: it
    loads the weights in model.dtype, so its states and answers would be another target's."""
    name = vllm_name(quantization)
    return (
        f"model.quantization={name} with {route}: expected a vLLM route, got one that runs the target through "
        f"transformers in model.dtype, not vLLM's {name} kernels: the head would learn another target than the "
        f"served one. Use {instead}, or model.quantization=null to train against the unquantized target"
    )


def checkpoint_quantization(target_dir: str | Path) -> Optional[str]:
    """The ``quant_method`` of the checkpoint's own ``quantization_config`` (config.json, or its
    text_config for a multimodal wrapper); None for a plain checkpoint or a hub id not here."""
    path = Path(target_dir) / "config.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    for node in (cfg, cfg.get("text_config") or {}):
        qc = node.get("quantization_config") if isinstance(node, dict) else None
        if isinstance(qc, dict) and qc.get("quant_method"):
            return str(qc["quant_method"])
    return None


@dataclass(frozen=True)
class ServedQuantization:
    """How the served target's weights run: ``name`` (vLLM's; None: as the checkpoint's plain
    weights) and where that comes from (``model.quantization``, the checkpoint's own config.json,
    or None)."""

    name: Optional[str]
    source: Optional[str]

    def to_dict(self) -> dict[str, Optional[str]]:
        return {"name": self.name, "source": self.source}

    def describe(self) -> str:
        if self.name is None:
            return "unquantized (the checkpoint's own weights, no quantization_config)"
        how = "applied by vLLM as it loads the weights" if self.source == "model.quantization" else self.source
        return f"{self.name} ({how})"


def served_quantization(quantization: Quantization | str | None, target_dir: str | Path) -> ServedQuantization:
    """What vLLM will run for ``model.quantization`` = ``quantization`` on the checkpoint in
    ``target_dir``. Refused (QuantizationError naming both) where vLLM would refuse it: a flag other
    than the checkpoint's own format, or a checkpoint-only format on a checkpoint without it."""
    asked, own = vllm_name(quantization), checkpoint_quantization(target_dir)
    where = Path(target_dir) / "config.json"
    if asked and own and asked != own:
        raise QuantizationError(
            f"model.quantization={asked}: expected null or {own!r} for this checkpoint, got {asked!r}: {where} carries "
            f"quantization_config.quant_method={own!r}, which vLLM serves it in (and refuses another --quantization "
            "for); set model.quantization=null"
        )
    if asked and not own and asked in {q.value for q in CHECKPOINT_ONLY}:
        raise QuantizationError(
            f"model.quantization={asked}: {where} carries no quantization_config, and vLLM reads {asked} weights "
            "only from a checkpoint in that format (it quantizes a plain checkpoint online to fp8 only); point "
            "model.path at the quantized checkpoint, or set model.quantization=fp8 or null (a random-weight "
            "model.source=tiny build is plain: null)"
        )
    if asked:
        return ServedQuantization(asked, "checkpoint's own quantization_config" if own else "model.quantization")
    if own:
        return ServedQuantization(own, "checkpoint's own quantization_config")
    return ServedQuantization(None, None)
