"""Checkpoints that are whole or absent: Lightning's own save writes the final file in place
(fsspec: a temp in the system temp dir, then moved, which is a copy across filesystems), so a
kill during a save can leave a truncated last.ckpt and no way to resume. Here every save is a
temp file beside the final one, fsynced and renamed (``eagle3.util.atomic``): a killed save leaves
the previous checkpoint whole, and resuming picks the newest whole one.

A checkpoint of a wide head is large (at Kimi-K2.5's width 1.14B trainable parameters: 13.7 GB
with AdamW's moments), and a run keeps several at once: train.py checks before the first step
that the disk holds them (``check_checkpoint_disk``), and a save that meets a full disk anyway
fails naming the file, the checkpoint's size, the free space and the whole checkpoints left.

A training checkpoint also exports as a vLLM/speculators eagle3 directory
(eagle3/draft/serving_format.py, written by the export's owner eagle3/serving/export_dir.py): it
carries everything needed (draft config, aux layer ids, target path, the trained weights and
d2t/t2d), so the target is not loaded."""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.serving_format import DraftMeta
from eagle3.store.disk import DiskSpaceError, check_free_disk, disk_full, format_bytes, free_bytes
from eagle3.util.atomic import atomic_path


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's own path
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_path(path, point="checkpoint_write") as tmp:
                torch.save(checkpoint, tmp)
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            if not disk_full(e):  # any other failure is reported as itself, whatever the free space
                raise
            need = _tensor_bytes(checkpoint)
            free = free_bytes(path.parent)  # the temp is gone: what a retry would find
            kept = sorted(p.name for p in path.parent.glob("*.ckpt") if whole_checkpoint(p))
            raise DiskSpaceError(
                f"{path}: disk full writing this checkpoint: needs {format_bytes(need)} ({need} bytes), "
                f"{format_bytes(free)} free ({type(e).__name__}: {e}). Whole checkpoints kept: "
                f"{', '.join(kept) or 'none'}. Free disk (or point hydra.run.dir at a larger one) and rerun "
                "the same command: it resumes from the newest whole checkpoint."
            ) from e

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """A resume reads tensors and plain data only (``weights_only=True`` whatever the caller
        or TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD says): a checkpoint is never a program."""
        return super().load_checkpoint(path, map_location=map_location or _cpu_storage, weights_only=True)


def _cpu_storage(storage: Any, location: Any) -> Any:  # Lightning's default map_location
    return storage


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a checkpoint's nested dicts and lists (what torch.save writes,
    less its small zip and pickle overhead)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def head_checkpoint_bytes(head: torch.nn.Module) -> int:
    """What one resume checkpoint of ``head`` holds, in bytes: the weights it keeps (its frozen
    target copies stay out) and AdamW's two moments per trainable parameter, each in its
    parameter's dtype. Works on a head built on the meta device (a disk estimate from config alone)."""
    frozen = {n for n, p in head.named_parameters() if not p.requires_grad}
    kept = sum(t.numel() * t.element_size() for k, t in head.state_dict().items() if k not in frozen)
    return kept + sum(2 * p.numel() * p.element_size() for p in head.parameters() if p.requires_grad)


def checkpoints_at_once(save_top_k: int, save_last: bool) -> int:
    """The most checkpoint files a run holds at one time: the best ``save_top_k``, last.ckpt when
    the checkpoint callback keeps it during the run, and the one being written beside them (a temp
    until renamed: eagle3/util/atomic.py). The run's end writes last.ckpt either way."""
    return int(save_top_k) + int(bool(save_last)) + 1


def check_checkpoint_disk(ckpt_dir: Path, checkpoint_bytes: int, at_once: int, enabled: bool = True) -> tuple[int, int]:
    """Raise ``DiskSpaceError`` unless ``ckpt_dir``'s disk holds ``at_once`` checkpoints of
    ``checkpoint_bytes`` (the checkpoints already there count as held: a resumed run replaces
    them). Returns (the bytes still to be found on the disk, the free bytes). The free space is
    the filesystem's (statfs): a quota, or space freed while the run trains, is not seen, so
    ``enabled=False`` (callbacks.model_checkpoint.check_disk=false) only measures."""
    existing = sum(p.stat().st_size for p in Path(ckpt_dir).glob("*.ckpt") if p.is_file())
    need = max(int(checkpoint_bytes), at_once * int(checkpoint_bytes) - existing)
    if not enabled:
        return need, free_bytes(ckpt_dir)
    free = check_free_disk(
        ckpt_dir,
        need,
        margin=1.05,
        hint=(
            f"A checkpoint of this head is {format_bytes(checkpoint_bytes)} (weights and AdamW's moments) and "
            f"the run holds up to {at_once} at once (callbacks.model_checkpoint.save_top_k best, last.ckpt, the "
            "one being written): point hydra.run.dir at a larger disk, free space, or keep fewer "
            "(callbacks.model_checkpoint.save_top_k=1, callbacks.model_checkpoint.save_last=false). The free "
            "space is the filesystem's as statfs reports it (no quota): if the space will be there, "
            "callbacks.model_checkpoint.check_disk=false skips this check."
        ),
    )
    return need, free


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holding more than tensors and plain data (a pickled object: code that
    ``torch.load(weights_only=False)`` would run)."""


def load_checkpoint_file(ckpt: Path) -> dict[str, Any]:
    """A training checkpoint's contents as tensors and plain data (``weights_only=True``): a file
    that carries any other pickled object is refused before anything in it runs."""
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        first = next((line for line in lines if "GLOBAL" in line), lines[0] if lines else type(e).__name__)
        raise UnsafeCheckpointError(
            f"{ckpt}: expected a checkpoint of tensors and plain data, got other pickled objects, which "
            f"are not loaded (they could run code): {first}"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"{ckpt}: expected a checkpoint dict, got {type(state).__name__}")
    return state


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


def checkpoint_head(ckpt: str | Path, num_draft_tokens: int | None = None) -> tuple[Eagle3DraftHead, DraftMeta]:
    """The head a training checkpoint holds and what its export needs besides the weights (the
    number of draft tokens replaced by ``num_draft_tokens`` where given): what the export's
    owner (eagle3/serving/export_dir.py: write_export) writes."""
    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise FileNotFoundError(f"ckpt={ckpt}: no such checkpoint file")
    state = load_checkpoint_file(ckpt)
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
    return head, meta
