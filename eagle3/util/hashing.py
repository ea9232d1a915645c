"""Content hashes: the one place that spells them (caches, fingerprints, shard checksums).

- ``short_sha`` / ``file_short_sha``: first 16 hex digits of a sha256, of bytes or of a file.
- ``file_sha256``: the full sha256 of a file, read in chunks (shard checksums).
- ``sampled_file_sha``: size + evenly spaced windows of a large file (model weights).
- ``ContentShaCache``: any of these for a file, remembered by path + size + mtime, so a
  large file is hashed once per machine and not at every start.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from eagle3.util.atomic import write_text

SAMPLE_WINDOWS = 64
SAMPLE_WINDOW_BYTES = 64 << 10
# a file modified this recently may change again within one mtime tick (a few ms on some
# filesystems) without its stamp changing: its hash is not remembered
RECENT_NS = 2_000_000_000


def short_sha(data: bytes | str) -> str:
    """First 16 hex digits of the sha256 of ``data`` (text is hashed as UTF-8)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def file_short_sha(path: Path) -> str | None:
    """``short_sha`` of a file's bytes, or None when there is no such file."""
    return short_sha(path.read_bytes()) if path.is_file() else None


def file_sha256(path: Path, chunk: int = 8 << 20) -> str:
    """The full sha256 (64 hex digits) of a file of any size."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sampled_file_sha(path: Path, windows: int = SAMPLE_WINDOWS, window: int = SAMPLE_WINDOW_BYTES) -> str:
    """``short_sha`` of the file's size and ``windows`` windows of ``window`` bytes spread
    evenly from its first byte to its last (the whole file when it is no larger than that).

    Reads 4 MiB of each file whatever its size. The first window holds a safetensors header
    (tensor names, dtypes, shapes); the other 63 land on tensors across the file, so another
    checkpoint of the same architecture (a fine-tune, a merged LoRA touching every layer)
    differs in some window. An edit confined to bytes between windows is not seen."""
    size = path.stat().st_size
    h = hashlib.sha256(f"size={size};".encode())
    with open(path, "rb") as f:
        if size <= windows * window:
            h.update(f.read())
        else:
            for i in range(windows):
                f.seek(i * (size - window) // (windows - 1))
                h.update(f.read(window))
    return h.hexdigest()[:16]


class ContentShaCache:
    """Hashes of files kept in one JSON file, each valid while the file's resolved path, size,
    mtime, inode number and inode change time (ctime) are the ones it was computed for. The
    mtime alone can be put back after an edit (``touch -d``, ``cp -p``, ``rsync -t``); the ctime
    cannot (the kernel sets it on every change, a restored mtime included), and a file replaced
    under its name has another inode."""

    def __init__(self, cache_file: str | Path | None):
        self.cache_file = Path(cache_file) if cache_file is not None else None
        self._entries: dict[str, dict] | None = None

    def _load(self) -> dict[str, dict]:
        if self._entries is None:
            self._entries = {}
            if self.cache_file is not None and self.cache_file.is_file():
                try:
                    self._entries = dict(json.loads(self.cache_file.read_text()))
                except (json.JSONDecodeError, TypeError, ValueError):  # unreadable: hashes are recomputed
                    self._entries = {}
        return self._entries

    def sha(self, path: Path, kind: str, compute: Callable[[Path], str]) -> str:
        """``compute(path)``, or the remembered value when path, size, mtime, inode and ctime are unchanged.
        ``kind`` names the hash (a sampled hash and a full one of one file are kept apart)."""
        real = Path(path).resolve()
        st = real.stat()
        key = f"{kind}:{real}"
        stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}
        entries = self._load()
        hit = entries.get(key)
        if isinstance(hit, dict) and {k: hit.get(k) for k in stamp} == stamp and isinstance(hit.get("sha"), str):
            return hit["sha"]
        value = compute(real)
        if time.time_ns() - st.st_mtime_ns > RECENT_NS:
            entries[key] = {**stamp, "sha": value}
            self._save()
        return value

    def _save(self) -> None:
        if self.cache_file is None:
            return
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            # concurrent runs: the last writer wins, others rehash
            write_text(self.cache_file, json.dumps(self._entries, indent=0, sort_keys=True))
        except OSError:  # a read-only cache directory costs a rehash next time, nothing else
            pass


def tree_sha(directory: Path, file_sha: Callable[[Path], str]) -> str:
    """``short_sha`` over a directory's files (relative path and ``file_sha`` of each, sorted;
    hidden files such as locks left out): equal for a copy of the directory anywhere."""
    files = sorted(
        p
        for p in Path(directory).rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )
    return short_sha(json.dumps([[p.relative_to(directory).as_posix(), file_sha(p)] for p in files]))
