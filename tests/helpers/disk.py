"""A disk that fills in the middle of a write."""

from __future__ import annotations

import errno
from pathlib import Path


def tear_writes(monkeypatch) -> None:
    """Every Path.write_text/write_bytes writes half its data, then fails as a full disk does."""

    def half(self, data, *args, **kwargs):
        raw = data.encode() if isinstance(data, str) else data
        with open(self, "wb") as f:
            f.write(raw[: len(raw) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", half)
    monkeypatch.setattr(Path, "write_bytes", half)
