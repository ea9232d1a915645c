"""One shard file: many samples concatenated, written atomically, verified on reopen.

Tensors: input_ids int64 [Ttot], loss_mask bool [Ttot], hidden [Ttot, L, H],
offsets int64 [n+1] (sample i is rows offsets[i]:offsets[i+1]). The safetensors metadata
repeats the dataset's identity (fingerprint, layer ids, hidden size, dtype) and lists the
sample ids, so a shard that was renamed into place but never reached the manifest (a crash
between the two) can be recognised and adopted instead of recomputed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3.store.layout import (
    FORMAT,
    SCHEMA_VERSION,
    ShardInfo,
    StoreError,
    dtype_name,
    file_sha256,
    save_tensors_atomic,
)

TENSORS = ("input_ids", "loss_mask", "hidden", "offsets")


@dataclass(frozen=True)
class ShardIdentity:
    """What every shard of one dataset must agree on."""

    fingerprint: str
    layer_ids: tuple[int, ...]
    hidden_size: int
    dtype: torch.dtype

    def metadata(self) -> dict[str, str]:
        return {
            "format": FORMAT,
            "schema_version": str(SCHEMA_VERSION),
            "fingerprint": self.fingerprint,
            "layer_ids": json.dumps(list(self.layer_ids)),
            "hidden_size": str(self.hidden_size),
            "dtype": dtype_name(self.dtype),
        }


def write_shard(path: Path, ident: ShardIdentity, sample_ids: list[str], input_ids: list[torch.Tensor],
                loss_masks: list[torch.Tensor], hiddens: list[torch.Tensor]) -> ShardInfo:
    """Concatenate samples into ``path`` (temp + fsync + rename) and describe the result."""
    lengths = torch.tensor([t.shape[0] for t in input_ids], dtype=torch.int64)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    mask = torch.cat(loss_masks)
    tensors = {
        "input_ids": torch.cat(input_ids),
        "loss_mask": mask,
        "hidden": torch.cat(hiddens),
        "offsets": offsets,
    }
    meta = ident.metadata() | {"sample_ids": json.dumps(sample_ids)}
    save_tensors_atomic(path, tensors, meta)
    return ShardInfo(
        file=path.name,
        num_samples=len(sample_ids),
        num_tokens=int(offsets[-1]),
        num_loss_tokens=int(mask.sum()),
        size_bytes=path.stat().st_size,
        sha256=file_sha256(path),
    )


def inspect_shard(path: Path, ident: ShardIdentity, expected: ShardInfo | None = None,
                  verify: str = "full") -> tuple[ShardInfo, list[str]]:
    """Check a shard on disk; return its description and sample ids, or raise StoreError.

    ``verify="full"`` also compares the sha256 with ``expected`` (when given); "fast"
    checks size, header, identity and offsets only (a bit flip inside the data passes).
    """
    from safetensors import safe_open

    if verify not in ("full", "fast"):
        raise StoreError(f"verify: expected 'full' or 'fast', got {verify!r}")
    if not path.is_file():
        raise StoreError(f"{path}: missing")
    size = path.stat().st_size
    if expected is not None and size != expected.size_bytes:
        raise StoreError(f"{path}: size: expected {expected.size_bytes} bytes, got {size} (truncated?)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            keys = set(f.keys())
            shapes = {k: f.get_slice(k).get_shape() for k in keys & set(TENSORS)}
            offsets = f.get_tensor("offsets") if "offsets" in keys else None
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise StoreError(f"{path}: unreadable safetensors file ({type(e).__name__}: {e})") from None
    want_meta = ident.metadata()
    wrong = {k: (v, meta.get(k)) for k, v in want_meta.items() if meta.get(k) != v}
    if wrong:
        field, (want, got) = next(iter(wrong.items()))
        raise StoreError(f"{path}: metadata {field}: expected {want}, got {got}")
    if keys != set(TENSORS):
        raise StoreError(f"{path}: tensors: expected {sorted(TENSORS)}, got {sorted(keys)}")
    try:
        sample_ids = json.loads(meta.get("sample_ids", ""))
    except json.JSONDecodeError:
        raise StoreError(f"{path}: metadata sample_ids: expected a JSON list, got unparsable text") from None
    n = len(sample_ids)
    total = int(offsets[-1]) if offsets is not None and offsets.numel() else -1
    L, H = len(ident.layer_ids), ident.hidden_size
    checks = [
        ("offsets", [n + 1], shapes["offsets"]),
        ("input_ids", [total], shapes["input_ids"]),
        ("loss_mask", [total], shapes["loss_mask"]),
        ("hidden", [total, L, H], shapes["hidden"]),
    ]
    for name, want, got in checks:
        if list(got) != want:
            raise StoreError(f"{path}: {name} shape: expected {want}, got {list(got)}")
    if int(offsets[0]) != 0 or bool((offsets[1:] < offsets[:-1]).any()):
        raise StoreError(f"{path}: offsets: expected 0-based non-decreasing, got {offsets.tolist()[:8]}...")
    if expected is not None:
        if expected.num_samples != n or expected.num_tokens != total:
            raise StoreError(
                f"{path}: expected {expected.num_samples} samples / {expected.num_tokens} tokens "
                f"(manifest), got {n} / {total}"
            )
        if verify == "full":
            digest = file_sha256(path)
            if digest != expected.sha256:
                raise StoreError(f"{path}: sha256: expected {expected.sha256}, got {digest} (corrupt)")
        return expected, sample_ids
    # no manifest entry (adopting an orphan): describe it from its contents
    with safe_open(str(path), framework="pt") as f:
        num_loss = int(f.get_tensor("loss_mask").sum())
    info = ShardInfo(file=path.name, num_samples=n, num_tokens=total, num_loss_tokens=num_loss,
                     size_bytes=size, sha256=file_sha256(path))
    return info, sample_ids
