"""Write the trained head as a directory that `vllm serve` and speculators both load."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import save_file

from eagle3.atomic import atomic_dir
from eagle3.model.export import export_state_dict, speculators_config_dict
from eagle3.model.head import Eagle3DraftHead


def export_head(head: Eagle3DraftHead, meta, out_dir: str | Path) -> Path:
    """config.json + model.safetensors (bf16), written to a temp dir then swapped into place
    (``eagle3.atomic.atomic_dir``): a killed export leaves the previous one whole."""
    out_dir = Path(out_dir)
    config = speculators_config_dict(
        meta.draft_config, meta.aux_layer_ids, meta.verifier_name_or_path, meta.num_speculative_tokens,
        verifier_architectures=meta.verifier_architectures,
    )
    with atomic_dir(out_dir, point="export_write") as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_file(export_state_dict(head), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "eagle3_meta.json").write_text(
            json.dumps({"draft_config": asdict(meta.draft_config), "aux_layer_ids": meta.aux_layer_ids}, indent=2)
        )
    return out_dir
