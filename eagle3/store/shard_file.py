"""One shard file: many samples concatenated, written atomically, verified on reopen.

Tensors: input_ids int64 [Ttot], loss_mask bool [Ttot], the hidden states (hidden [Ttot, L, H],
or the fp8 format's tensors: eagle3/store/storage_format.py), offsets int64 [n+1] (sample i is
rows offsets[i]:offsets[i+1]). The safetensors metadata
repeats the dataset's identity (fingerprint, layer ids, hidden size, dtype, a storage format
other than exact) and lists the
sample ids, so a shard that was renamed into place but never reached the manifest (a crash
between the two) can be recognised and adopted instead of recomputed.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3.store.device_encode import encoded_parts
from eagle3.store.layout import (
    FORMAT,
    SCHEMA_VERSION,
    Manifest,
    ShardInfo,
    StoreError,
    dtype_from_name,
    dtype_name,
    file_sha256,
)
from eagle3.store.storage_format import StorageFormat
from eagle3.store.teacher_topk import TeacherProjection
from eagle3.util.atomic import atomic_path

WRITE_CHUNK = 32 << 20  # bytes per step: hashed here while the IO thread writes the same chunk

# safetensors' dtype names, and the rank safetensors orders tensors by (higher first, then by
# name): the same order as its own writer, so a shard is the file safetensors would write.
_ST_DTYPE = {
    torch.bool: ("BOOL", 0),
    torch.uint8: ("U8", 4),
    torch.int8: ("I8", 5),
    torch.float8_e5m2: ("F8_E5M2", 6),
    torch.float8_e4m3fn: ("F8_E4M3", 7),
    torch.int16: ("I16", 9),
    torch.float16: ("F16", 11),
    torch.bfloat16: ("BF16", 12),
    torch.int32: ("I32", 13),
    torch.float32: ("F32", 15),
    torch.float64: ("F64", 17),
    torch.int64: ("I64", 18),
}


@dataclass(frozen=True)
class ShardIdentity:
    """What every shard of one dataset must agree on."""

    fingerprint: str
    layer_ids: tuple[int, ...]
    hidden_size: int
    dtype: torch.dtype
    storage: StorageFormat = StorageFormat()  # the on-disk format: eagle3/store/storage_format.py

    def tensors(self) -> tuple[str, ...]:
        """The tensors a shard of this identity holds."""
        return ("input_ids", "loss_mask", *self.storage.tensor_names(), "offsets")

    def metadata(self) -> dict[str, str]:
        # exact shards carry no storage key, and shards with the final layer no teacher_topk key:
        # those written before the keys existed are the same
        return self.storage.to_metadata() | {
            "format": FORMAT,
            "schema_version": str(SCHEMA_VERSION),
            "fingerprint": self.fingerprint,
            "layer_ids": json.dumps(list(self.layer_ids)),
            "hidden_size": str(self.hidden_size),
            "dtype": dtype_name(self.dtype),
        }


def manifest_identity(m: Manifest) -> ShardIdentity:
    """The identity every shard a manifest lists must have."""
    return ShardIdentity(m.fingerprint, tuple(m.layer_ids), m.hidden_size, dtype_from_name(m.dtype), m.storage)


_DTYPE_OF_ST = {name: dtype for dtype, (name, _) in _ST_DTYPE.items()}


def map_shard(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a shard as a view of the file mapped in memory (copy-on-write, private to
    this process): a sample's rows are then sliced with no read and no copy, and the batch's
    collate copies them once, from the page cache. A tensor whose bytes do not sit at a multiple
    of its item size (a file another writer laid out; safetensors' own order never does this) is
    read whole instead. The caller has checked the file's size against its manifest."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # the mapping outlives the descriptor
    (header_len,) = struct.unpack("<Q", mapped[:8])
    header = json.loads(mapped[8 : 8 + header_len])
    raw = torch.frombuffer(mapped, dtype=torch.uint8)  # [file bytes], holds the mapping alive
    base = 8 + header_len
    views: dict[str, torch.Tensor] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, (start, end) = _DTYPE_OF_ST[meta["dtype"]], meta["data_offsets"]
        if (base + start) % dtype.itemsize:
            views[name] = raw[base + start : base + end].clone().view(dtype).reshape(meta["shape"])
        else:
            views[name] = raw[base + start : base + end].view(dtype).view(meta["shape"])
    return views


def _byte_view(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in memory order (little-endian, as safetensors stores them), no copy."""
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return t.view(torch.uint8).reshape(-1).numpy().data  # the array's buffer as a memoryview


def save_concatenated_hashing(
    final: Path, parts: dict[str, list[torch.Tensor]], metadata: dict[str, str]
) -> tuple[int, str]:
    """Write a safetensors file whose tensor ``name`` is ``torch.cat(parts[name])``, without
    building the concatenation, hashing exactly the bytes written in the same pass (temp +
    fsync + rename). Returns (size in bytes, sha256 hex).

    The file is the one ``safetensors.torch.save_file`` writes for the concatenated tensors
    (same header fields, tensor order and padding; metadata keys sorted). The sha256 of each
    chunk is computed while an IO thread writes that same chunk: never a re-read of the file.
    """
    if sys.byteorder != "little":  # safetensors is little-endian; we write memory as it is
        raise StoreError(f"{final}: writing shards needs a little-endian machine, got {sys.byteorder}")
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    views: list[memoryview] = []
    order = sorted(parts, key=lambda k: (-_ST_DTYPE[parts[k][0].dtype][1], k))
    start = 0
    for name in order:
        pieces = parts[name]
        dtypes = {p.dtype for p in pieces}
        tails = {tuple(p.shape[1:]) for p in pieces}
        if len(dtypes) != 1 or len(tails) != 1:
            raise StoreError(
                f"{final}: tensor {name}: expected one dtype and trailing shape across samples, "
                f"got {sorted(map(str, dtypes))} / {sorted(tails)}"
            )
        shape = [sum(int(p.shape[0]) for p in pieces), *next(iter(tails))]
        piece_views = [_byte_view(p) for p in pieces]
        nbytes = sum(v.nbytes for v in piece_views)
        header[name] = {"dtype": _ST_DTYPE[pieces[0].dtype][0], "shape": shape, "data_offsets": [start, start + nbytes]}
        start += nbytes
        views += piece_views
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    head += b" " * (-len(head) % 8)  # safetensors pads the header so the data starts 8-aligned
    views = [memoryview(struct.pack("<Q", len(head))), memoryview(head), *views]

    digest = hashlib.sha256()
    size = 0
    with atomic_path(final, point="shard_write") as tmp:
        with open(tmp, "wb") as f, ThreadPoolExecutor(1, thread_name_prefix="shard-io") as io:
            for view in views:
                for i in range(0, view.nbytes, WRITE_CHUNK):
                    chunk = view[i : i + WRITE_CHUNK]
                    written = io.submit(f.write, chunk)  # both release the GIL: they overlap
                    digest.update(chunk)
                    written.result()
                    size += chunk.nbytes
    return size, digest.hexdigest()


def write_shard(
    path: Path,
    ident: ShardIdentity,
    sample_ids: list[str],
    input_ids: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    hiddens: Sequence[torch.Tensor | Mapping[str, torch.Tensor]],
    teacher: TeacherProjection | None = None,
    encode_device: torch.device | None = None,
) -> ShardInfo:
    """Concatenate samples into ``path`` (temp + fsync + rename) and describe the result; the
    sha256 is taken from the bytes as they are written (see ``save_concatenated_hashing``).
    ``hiddens``: per sample hidden [T, L, H], encoded here in ``ident.storage``, or that format's
    tensors already (encoded on the capture device), written as they are. ``teacher``: the
    projection that gives the format's top-k (``teacher_topk``) from a sample's final layer.
    ``encode_device``: where the encode runs (a GPU: the same bits, a chunk of samples at a time)."""
    k = ident.storage.teacher_topk
    if k is not None and (teacher is None or teacher.k != k):
        if any(not isinstance(h, Mapping) for h in hiddens):
            got = "none" if teacher is None else f"k={teacher.k}"
            raise StoreError(
                f"{path}: teacher: expected the target's projection with k={k} to encode "
                f"captured states (capture.teacher_topk), got {got}"
            )
    lengths = torch.tensor([t.shape[0] for t in input_ids], dtype=torch.int64)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    mask = torch.cat(loss_masks)
    parts = {
        "input_ids": [torch.cat(input_ids)],
        "loss_mask": [mask],
        "offsets": [offsets],
    }
    # the big ones: streamed piece by piece, never concatenated on the host (on a GPU, encoded a
    # chunk of samples at a time: eagle3/store/device_encode.py)
    encoded = encoded_parts(hiddens, ident.storage, teacher, encode_device)
    parts |= {name: encoded[name] for name in ident.storage.tensor_names()}
    meta = ident.metadata() | {"sample_ids": json.dumps(sample_ids)}
    size, sha = save_concatenated_hashing(path, parts, meta)
    return ShardInfo(
        file=path.name,
        num_samples=len(sample_ids),
        num_tokens=int(offsets[-1]),
        num_loss_tokens=int(mask.sum()),
        size_bytes=size,
        sha256=sha,
    )


def inspect_shard(
    path: Path, ident: ShardIdentity, expected: ShardInfo | None = None, verify: str = "full"
) -> tuple[ShardInfo, list[str]]:
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
            shapes = {k: f.get_slice(k).get_shape() for k in keys}
            offsets = f.get_tensor("offsets") if "offsets" in keys else None
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise StoreError(f"{path}: unreadable safetensors file ({type(e).__name__}: {e})") from None
    try:  # a shard without the keys is exact / holds the final layer (written before they existed)
        stored = StorageFormat.from_metadata(meta)
    except ValueError as e:
        raise StoreError(f"{path}: metadata storage, teacher_topk: {e}") from None
    if stored != ident.storage:
        raise StoreError(f"{path}: metadata storage: expected {ident.storage}, got {stored}")
    wrong = {k: (v, meta.get(k)) for k, v in ident.metadata().items() if meta.get(k) != v}
    if wrong:
        field, (want_value, got_value) = next(iter(wrong.items()))
        raise StoreError(f"{path}: metadata {field}: expected {want_value}, got {got_value}")
    names = ident.tensors()
    if keys != set(names):
        raise StoreError(f"{path}: tensors: expected {sorted(names)}, got {sorted(keys)}")
    assert offsets is not None  # one of ident.tensors(), all checked present above
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
        *((name, want, shapes[name]) for name, want in ident.storage.tensor_shapes(total, L, H).items()),
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
    info = ShardInfo(
        file=path.name,
        num_samples=n,
        num_tokens=total,
        num_loss_tokens=num_loss,
        size_bytes=size,
        sha256=file_sha256(path),
    )
    return info, sample_ids
