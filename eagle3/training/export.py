"""Write the trained head as a directory that `vllm serve` and speculators both load."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import save_file

from eagle3.model.export import export_state_dict, speculators_config_dict
from eagle3.model.head import Eagle3DraftHead


def export_head(head: Eagle3DraftHead, meta, out_dir: str | Path) -> Path:
    """config.json + model.safetensors (bf16), written to a temp dir then renamed."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = speculators_config_dict(
        meta.draft_config, meta.aux_layer_ids, meta.verifier_name_or_path, meta.num_speculative_tokens,
        verifier_architectures=meta.verifier_architectures,
    )
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_file(export_state_dict(head), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "eagle3_meta.json").write_text(
        json.dumps({"draft_config": asdict(meta.draft_config), "aux_layer_ids": meta.aux_layer_ids}, indent=2)
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir
