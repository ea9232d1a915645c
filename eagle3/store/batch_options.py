"""What a packed loader is asked for, as two values: the shape of each batch and the order
this rank reads the batches in (eagle3/store/packing.py builds the loader from them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchShape:
    """How a packed batch is laid out: ``max_tokens`` tokens in one row (``row_tokens`` None) or
    in rows of ``row_tokens`` each; ``fixed_shape``: always the full shape, shorter rows padded,
    so a compiled step sees one shape."""

    max_tokens: int  # tokens per batch (train.max_tokens_per_batch)
    row_tokens: int | None = None  # tokens per packed row (train.row_tokens); None: one row
    fixed_shape: bool = False  # [max_tokens // row_tokens, row_tokens] (or [1, max_tokens]) always


@dataclass(frozen=True)
class BatchOrder:
    """Which batches this rank reads, in which order (``PackedBatchSampler``'s stream): each pass
    a seeded permutation when ``shuffle``, this rank's share of ``world_size`` ranks, starting
    after the ``batches_done`` of a resumed run."""

    shuffle: bool = False
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    batches_done: int = 0  # optimizer steps x accumulation already trained (a resume)
