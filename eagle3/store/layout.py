"""The dataset directory's layout: file names, the manifest schema, atomic writes, checksums.

    manifest.json                 written last, always by temp file + fsync + rename (eagle3/util/atomic.py)
    shard-00000.safetensors       input_ids int64 [Ttot], loss_mask bool [Ttot],
                                  hidden [Ttot, L, H] (storage "exact"; "fp8": the aux layers
                                  in float8 with scales, the final layer exact:
                                  eagle3/store/storage_format.py; with teacher_topk k the
                                  target's top-k ids and log-probabilities in place of the
                                  final layer), offsets int64 [n+1];
                                  metadata: fingerprint, sample ids (JSON), layer ids, dtype
    token_freq.safetensors        counts int64 [target vocab] over loss-masked tokens
    vocab-<V>.safetensors         d2t int64 [V], t2d bool [target vocab]

A dataset for online training (``hidden_states: "online"``) holds the same files except the
shards: one ``tokens.safetensors`` with input_ids, loss_mask and offsets; the trainer runs the
target for the hidden states (eagle3/store/token_samples.py).

Only ``eagle3.store`` reads or writes these names.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle3.store.storage_format import StorageFormat
from eagle3.util.atomic import TMP_MARK, atomic_path, write_bytes  # noqa: F401 - TMP_MARK: the writer's temp names
from eagle3.util.file_mode import apply_umask
from eagle3.util.hashing import file_sha256  # noqa: F401 - shard checksums, spelled once

SCHEMA_VERSION = 1
FORMAT = "eagle3-hidden-states"
MANIFEST = "manifest.json"
LOCK = ".writer.lock"  # held (flock) by whoever writes the dataset
TOKEN_FREQ = "token_freq.safetensors"
TOKENS = "tokens.safetensors"  # an online dataset's one sample file
STORED, ONLINE = "stored", "online"  # Manifest.hidden_states: in the shards, or computed by the trainer
SHARD_RE = re.compile(r"^shard-(\d{5,})\.safetensors$")


class StoreError(RuntimeError):
    """A dataset directory that is not what the caller needs (names file, expected, got)."""


class IncompleteDatasetError(StoreError):
    pass


class FingerprintMismatchError(StoreError):
    pass


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def vocab_name(draft_vocab_size: int) -> str:
    return f"vocab-{int(draft_vocab_size)}.safetensors"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise StoreError(f"dtype: expected a torch dtype name (e.g. 'bfloat16'), got {name!r}")
    return dt


@dataclass
class ShardInfo:
    file: str
    num_samples: int
    num_tokens: int
    num_loss_tokens: int
    size_bytes: int
    sha256: str


@dataclass
class Manifest:
    fingerprint: str
    fingerprint_inputs: dict[str, Any]
    layer_ids: list[int]
    hidden_size: int
    dtype: str
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT
    complete: bool = False
    num_samples: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    shards: list[ShardInfo] = field(default_factory=list)
    sample_ids: list[str] = field(default_factory=list)  # done, in dataset order
    val_ids: list[str] = field(default_factory=list)  # the validation split (subset of sample_ids)
    token_freq: str | None = None
    vocabs: dict[str, str] = field(default_factory=dict)  # str(V) -> file name
    # how it was made, not part of its identity (eagle3/extraction/identity.py): regen_engine (the engine
    # that wrote the answers when data.regenerate), data_path and target_dir as extraction read them
    provenance: dict[str, Any] = field(default_factory=dict)
    # "stored": the shards hold hidden states; "online": token ids only, the trainer runs the
    # target (layer_ids, hidden_size and dtype then say what it will capture)
    hidden_states: str = STORED
    # the shards' on-disk format (capture.storage and capture.teacher_topk; dtype stays what a reader
    # gets back), in the JSON as its two keys "storage" and "teacher_topk", last (StorageFormat.to_manifest):
    # a manifest written before the keys existed is exact, the states as captured, the final layer kept
    storage: StorageFormat = StorageFormat()

    def recount(self) -> None:
        """Counts follow the shard list: one source of truth."""
        self.num_samples = sum(s.num_samples for s in self.shards)
        self.num_tokens = sum(s.num_tokens for s in self.shards)
        self.num_loss_tokens = sum(s.num_loss_tokens for s in self.shards)

    def ids_by_shard(self) -> dict[str, list[str]]:
        """Each listed shard's sample ids (sample_ids holds them shard after shard); {} when the
        counts disagree with that."""
        if sum(s.num_samples for s in self.shards) != len(self.sample_ids):
            return {}
        out, start = {}, 0
        for s in self.shards:
            out[s.file] = list(self.sample_ids[start : start + s.num_samples])
            start += s.num_samples
        return out

    def to_json(self) -> str:
        raw = asdict(self)
        raw.pop("storage")  # the last field: its two keys end the JSON, as the fields they were
        return json.dumps(raw | self.storage.to_manifest(), indent=1)

    @classmethod
    def read(cls, directory: Path) -> "Manifest":
        path = Path(directory) / MANIFEST
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise StoreError(f"{path}: no manifest; not a dataset directory (run extract.py)") from None
        except json.JSONDecodeError as e:
            # the shards are whole on their own (each names its samples): only the manifest is lost
            raise StoreError(
                f"{path}: corrupt manifest ({e}); do not delete the dataset: delete only this file "
                f"(rm {path}) and re-run the same extract.py command: it adopts every whole shard "
                "beside it and captures only the samples none of them holds"
            ) from None
        if raw.get("format") != FORMAT:
            raise StoreError(f"{path}: format: expected {FORMAT!r}, got {raw.get('format')!r}")
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise StoreError(
                f"{path}: schema_version: expected {SCHEMA_VERSION}, got {raw.get('schema_version')} "
                "(written by another eagle3 version; re-run extract.py into a new directory)"
            )
        try:
            raw["storage"] = StorageFormat.from_manifest(raw)
        except ValueError as e:
            raise StoreError(f"{path}: keys storage, teacher_topk: {e} (written by another eagle3 version?)") from None
        raw.pop("teacher_topk", None)
        raw["shards"] = [ShardInfo(**s) for s in raw.get("shards", [])]
        try:
            return cls(**raw)
        except TypeError as e:
            raise StoreError(f"{path}: unexpected manifest fields ({e})") from None

    @classmethod
    def read_complete(cls, directory: Path) -> "Manifest | None":
        """The manifest of a finished dataset in ``directory``; None if absent, unreadable or
        incomplete (a run that still has work to do)."""
        try:
            m = cls.read(directory)
        except StoreError:
            return None
        return m if m.complete else None

    def write(self, directory: Path) -> None:
        write_bytes(Path(directory) / MANIFEST, self.to_json().encode(), point="manifest_write")


def save_tensors_atomic(final: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    with atomic_path(final) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        apply_umask(tmp)  # safetensors leaves its files 0600
