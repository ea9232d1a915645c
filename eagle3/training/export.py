"""A training checkpoint as a vLLM/speculators eagle3 directory (eagle3/model/serving_format.py).

The checkpoint carries everything needed (draft config, aux layer ids, verifier path, the
trained weights and d2t/t2d); the target is not loaded.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from eagle3.model.head import Eagle3DraftHead
from eagle3.model.serving_format import DraftMeta, save_head


def export_checkpoint(ckpt: str | Path, out: str | Path | None = None, num_draft_tokens: int | None = None) -> Path:
    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise FileNotFoundError(f"ckpt={ckpt}: no such checkpoint file")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    if "eagle3_meta" not in state:
        raise ValueError(f"{ckpt}: not an eagle3 training checkpoint (no 'eagle3_meta' entry)")
    meta = DraftMeta.from_dict(state["eagle3_meta"])
    if num_draft_tokens is not None:
        meta = replace(meta, num_speculative_tokens=int(num_draft_tokens))
    head = Eagle3DraftHead(meta.draft_config)
    weights = {k.removeprefix("head."): v for k, v in state["state_dict"].items() if k.startswith("head.")}
    missing, unexpected = head.load_state_dict(weights, strict=False)
    trained_missing = [k for k in missing if not k.startswith(("embed_tokens", "target_"))]
    if trained_missing or unexpected:
        raise ValueError(
            f"{ckpt}: weights do not fit the draft config (missing {trained_missing}, unexpected {unexpected})"
        )
    out = Path(out) if out else ckpt.parent.parent / "export"
    return save_head(head, meta, out)
