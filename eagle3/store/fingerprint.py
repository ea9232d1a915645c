"""The dataset's identity: a hash of everything that changes its contents.

extract.py and train.py both compute it from config alone (what goes in: eagle3/extraction/identity.py),
so train.py finds the dataset without a path.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

import torch

from eagle3.store.layout import StoreError
from eagle3.util.hashing import short_sha


def canonical(value: Any, where: str = "inputs") -> Any:
    """JSON-ready form with one spelling per value; anything ambiguous is refused."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise StoreError(f"fingerprint {where}: expected a finite number, got {value}")
        return value
    if isinstance(value, enum.Enum):
        return canonical(value.value, where)
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise StoreError(f"fingerprint {where}: expected string keys, got {k!r}")
            out[k] = canonical(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [canonical(v, f"{where}[{i}]") for i, v in enumerate(value)]
    # OmegaConf containers and the like: convert before hashing, never hash a repr
    raise StoreError(
        f"fingerprint {where}: expected JSON-like data (dict/list/str/number/bool/None, "
        f"enum, torch.dtype, path), got {type(value).__name__}"
    )


def dataset_fingerprint(inputs: Mapping[str, Any]) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of ``inputs``."""
    text = json.dumps(canonical(inputs), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return short_sha(text)


def dataset_dir(datasets_dir: str | Path, name_prefix: str, fingerprint: str) -> Path:
    """``<datasets_dir>/<prefix>-<fingerprint>``; the prefix is for people, the hash for identity."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name_prefix)).strip("._") or "dataset"
    if not re.fullmatch(r"[0-9a-f]{16}", fingerprint):
        raise StoreError(f"fingerprint: expected 16 hex digits, got {fingerprint!r}")
    return Path(datasets_dir) / f"{safe}-{fingerprint}"
