"""Deterministic train/val split by hashing a sample's id (never its position).

A sample's side depends only on (seed, id), so it does not move when ``max_samples``
grows, when records before it are skipped, or when a run reads the file in a different
number of steps. SHA-256 rather than Python's ``hash()``, which is salted per process.
"""

from __future__ import annotations

import hashlib

_SCALE = float(1 << 64)


def split_score(sample_id: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, sample_id)."""
    digest = hashlib.sha256(f"{seed}\x00{sample_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def check_val_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")


def is_validation(sample_id: str, val_fraction: float, seed: int) -> bool:
    check_val_fraction(val_fraction)
    return split_score(sample_id, seed) < val_fraction


def interleaved(train: list, val: list) -> list:
    """train and val in one list, each in its own order, val spread evenly through it: a
    capture cut short at any point keeps about the split's share of validation samples."""
    keyed = [((i + 0.5) / len(train), 0, s) for i, s in enumerate(train)]
    keyed += [((j + 0.5) / len(val), 1, s) for j, s in enumerate(val)]
    return [s for _, _, s in sorted(keyed, key=lambda k: (k[0], k[1]))]
