"""How a ShardWriter writes its shards and checks those already on disk: two small values, so
the writer's caller says each in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WriteOptions:
    """How the shards are written: their size, on which threads, and where the states are
    encoded into the storage format."""

    shard_max_tokens: int = 65536  # tokens per shard file (capture.shard_max_tokens)
    # shards hashed and written on writer threads while the caller goes on (``flush()`` still
    # waits until every queued sample is durable); False: in the caller's thread
    background: bool = False
    writer_threads: int = 1  # shards written at once (capture.writer_threads)
    encode_device: torch.device | str | None = None  # the writer threads encode there; None: the host


@dataclass(frozen=True)
class ExistingShards:
    """How the shards already on disk are checked when the writer opens: ``verify`` "full" (size,
    header and sha256 of every byte) or "fast" (size, header, identity and offsets); ``redo``:
    listed shards the caller already found damaged, redone without being inspected again."""

    verify: str = "full"
    redo: Sequence[str] = ()  # shard file names
