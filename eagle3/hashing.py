"""Short content hashes that key caches and fingerprints (one spelling for the whole package)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def short_sha(data: bytes | str) -> str:
    """First 16 hex digits of the sha256 of ``data`` (text is hashed as UTF-8)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def file_short_sha(path: Path) -> str | None:
    """``short_sha`` of a file's bytes, or None when there is no such file."""
    return short_sha(path.read_bytes()) if path.is_file() else None
