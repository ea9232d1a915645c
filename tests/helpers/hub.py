"""A local Hugging Face hub cache, laid out as huggingface_hub lays one out."""

from __future__ import annotations

import shutil
from pathlib import Path


def add_hub_snapshot(hub: Path, repo: str, commit: str, target_dir: Path, refs: tuple[str, ...] = ()) -> Path:
    """A model directory as huggingface_hub caches it: snapshots/<commit>/..., refs/<name> -> commit."""
    root = hub / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    shutil.copytree(target_dir, snap)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return snap
