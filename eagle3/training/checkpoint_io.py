"""Checkpoints that are whole or absent: Lightning's own save writes the final file in place
(fsspec: a temp in the system temp dir, then moved, which is a copy across filesystems), so a
kill during a save can leave a truncated last.ckpt and no way to resume. Here every save is a
temp file beside the final one, fsynced and renamed (``eagle3.atomic``): a killed save leaves
the previous checkpoint whole, and resuming picks the newest whole one."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from eagle3.atomic import atomic_path


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's own path
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, point="checkpoint_write") as tmp:
            torch.save(checkpoint, tmp)


def whole_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete torch.save file (a zip whose central directory, written
    last, is there); a file cut short by a crash is not."""
    try:
        with zipfile.ZipFile(path) as z:
            return bool(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def newest_whole_checkpoint(ckpt_dir: Path) -> Path | None:
    """last.ckpt when it is whole, else the most recently written whole *.ckpt, else None."""
    last = ckpt_dir / "last.ckpt"
    if last.is_file() and whole_checkpoint(last):
        return last
    others = sorted(
        (p for p in ckpt_dir.glob("*.ckpt") if p != last and p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    return next((p for p in others if whole_checkpoint(p)), None)
