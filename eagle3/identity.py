"""What identifies an extracted dataset: one fingerprint, computed the same way by
extract.py (to name the directory it writes) and train.py (to find it from config alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from eagle3.hashing import file_short_sha, short_sha
from eagle3.store.fingerprint import dataset_dir, dataset_fingerprint

SCHEMA_VERSION = 1
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model")


def fingerprint_inputs(cfg: Any, model_dir: str) -> dict:
    """Everything that changes the stored bytes, and nothing that does not (batch sizes,
    backend and topology give the same hidden states within tolerance)."""
    d = Path(model_dir)
    data = OmegaConf.to_container(cfg.data, resolve=True, enum_to_str=True)
    data.pop("regen_batch_size", None)
    data.pop("regen_static_cache", None)  # how the answers are computed, not what they are
    if data.get("regenerate"):  # which engine wrote the answers, not "auto"
        from eagle3.data.regenerate import resolve_backend

        data["regen_backend"] = resolve_backend(data["regen_backend"])
    else:  # regeneration fields that cannot change unregenerated data: earlier
        # datasets keep their fingerprint (train.py still finds them)
        data.pop("regen_backend", None)
        data.pop("regen_max_turns", None)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "name": str(cfg.model.name),
            "dir": d.name,
            "config_sha": file_short_sha(d / "config.json"),
            "num_layers": int(cfg.model.num_layers),
            "hidden_size": int(cfg.model.hidden_size),
        },
        "capture_ids": [int(i) for i in cfg.layers.capture_ids],
        "capture_dtype": str(cfg.capture.dtype),
        "data": data,
        "tokenizer": {f: file_short_sha(d / f) for f in _TOKENIZER_FILES if (d / f).is_file()},
        "chat_template_override": short_sha(str(cfg.model.chat_template).encode()) if cfg.model.chat_template else None,
    }


def dataset_path(cfg: Any, model_dir: str) -> Path:
    inputs = fingerprint_inputs(cfg, model_dir)
    return dataset_dir(cfg.paths.data_dir, f"{cfg.model.name}-{cfg.data.name}", dataset_fingerprint(inputs))
