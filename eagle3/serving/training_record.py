"""The training record of an export: how its head was trained, as eagle3_meta.json's
"training" key, so the export carries it (to the Hub too) and its model card
(eagle3/serving/model_card.py) reads it from the folder alone.

Written at export time from train.py's run dir beside the checkpoint: summary.json (steps, the
fit's seconds, the machine, the best metric), dataset_manifest.json (the data: sources, samples,
tokens, regeneration; the target's weights by hash) and run_config.json (the target's name, hub id
and revision). An export from a checkpoint without its run dir has none, and its card says so.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Optional

from eagle3.draft.export_files import META
from eagle3.util.atomic import write_text

META_FILE = META
RECORD_KEY = "training"  # the training record's key in eagle3_meta.json


def machine_record(accelerator: str, devices: int, num_nodes: int) -> dict[str, Any]:
    """The machine a training ran on, as summary.json keeps it."""
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or platform.machine()
    return {
        "accelerator": str(accelerator),
        "devices": int(devices),
        "num_nodes": int(num_nodes),
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }


def read_json(path: Path) -> Optional[dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else None


def _checkpoint_facts(ckpt: Optional[Path]) -> tuple[Optional[int], Optional[int]]:
    """(the optimizer steps the exported checkpoint had taken, Lightning's global_step; the number
    of draft tokens it was trained and evaluated with, its eagle3_meta's), read memory-mapped: the
    tensors are not loaded."""
    if ckpt is None or not ckpt.is_file():
        return None, None
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    state = state if isinstance(state, dict) else {}
    step, k = state.get("global_step"), (state.get("eagle3_meta") or {}).get("num_speculative_tokens")
    return (int(step) if step is not None else None), (int(k) if k is not None else None)


def training_record(run_dir: str | Path, ckpt: str | Path | None = None) -> Optional[dict[str, Any]]:
    """What the run dir of a training (train.py's summary.json, dataset_manifest.json and
    run_config.json) says about the head exported from ``ckpt`` (default: the run's best, else
    last.ckpt); None where the run dir holds no summary.json."""
    run_dir = Path(run_dir)
    summary = read_json(run_dir / "summary.json")
    if summary is None:
        return None
    manifest = read_json(run_dir / "dataset_manifest.json")
    if manifest is None and summary.get("dataset_dir"):
        manifest = read_json(Path(summary["dataset_dir"]) / "manifest.json")
    manifest = manifest or {}
    model = ((read_json(run_dir / "run_config.json") or {}).get("config") or {}).get("model") or {}
    fingerprint = manifest.get("fingerprint_inputs") or {}
    checkpoint = Path(ckpt) if ckpt else Path(summary.get("best_checkpoint") or run_dir / "checkpoints" / "last.ckpt")
    step, trained_k = _checkpoint_facts(checkpoint)
    return {
        "target": {
            **{k: model.get(k) for k in ("name", "hub_id", "path", "revision")},
            "weights": (fingerprint.get("model") or {}).get("weights"),  # {file: sampled sha256}
        },
        "data": {
            **(fingerprint.get("data") or {}),
            "dataset": Path(str(summary.get("dataset_dir") or "")).name or None,
            "samples": manifest.get("num_samples"),
            "val_samples": len(manifest.get("val_ids") or []),
            "tokens": manifest.get("num_tokens"),
            "loss_tokens": manifest.get("num_loss_tokens"),
            "regen_engine": (manifest.get("provenance") or {}).get("regen_engine"),
            # data.mixture: per source its weight, samples and validation samples
            "mixture_counts": (manifest.get("provenance") or {}).get("mixture"),
            "hidden_states": summary.get("hidden_states"),
        },
        "run": {
            "global_step": summary.get("global_step"),
            "checkpoint": checkpoint.name,
            "checkpoint_step": step,
            # the K of the training (its replay and evaluation); config.json's is the export's, which
            # python export.py num_draft_tokens=<K> sets for serving
            "num_draft_tokens": trained_k,
            "fit_seconds": summary.get("fit_seconds"),
            "machine": summary.get("machine"),
            "best_metric": summary.get("best_metric"),
            "best_metric_value": summary.get("best_metric_value"),
        },
    }


def write_training_record(export_dir: str | Path, run_dir: str | Path, ckpt: str | Path | None = None) -> bool:
    """The training record from ``run_dir``, as eagle3_meta.json's "training"; False (nothing
    written) where the run dir holds no summary.json."""
    record = training_record(run_dir, ckpt)
    if record is None:
        return False
    set_training_record(export_dir, record)
    return True


def set_training_record(export_dir: str | Path, record: dict[str, Any]) -> None:
    path = Path(export_dir) / META_FILE
    meta = read_json(path) or {}
    write_text(path, json.dumps({**meta, RECORD_KEY: record}, indent=2))


def read_record(export_dir: str | Path) -> dict[str, Any]:
    """The export's training record, {} where it has none."""
    return (read_json(Path(export_dir) / META_FILE) or {}).get(RECORD_KEY) or {}
