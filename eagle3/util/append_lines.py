"""Whole lines appended to a JSONL cache, one writer at a time, durable once appended.

The caches that grow batch by batch (the target's regenerated answers, the prompts it writes
itself) are shared by every run of one config: two extractions may append at once. An append
takes the file's lock (``<file>.lock``, ``eagle3/util/locks.py``; waited for as long as
``lock_wait_s()``), writes the lines in one ``write``, flushes and fsyncs: a reader never sees
two runs' lines interleaved, and a line the run has counted as cached survives a crash (a line
cut by a crash mid-write is skipped by the reader and made again).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from eagle3.util.locks import DirLock, lock_wait_s


def append_lines(path: str | Path, lines: Iterable[str], what: str) -> None:
    """Append ``lines`` (no newlines in them) to ``path`` under its lock, then fsync; ``what``
    names the file in a refusal (``LockHeldError`` after ``lock_wait_s()``)."""
    path = Path(path)
    text = "".join(f"{line}\n" for line in lines)
    if not text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with DirLock(path.with_name(path.name + ".lock"), f"another run is appending to {what} {path}", lock_wait_s()):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            data = text.encode()
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
