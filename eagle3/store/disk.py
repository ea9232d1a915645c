"""What a dataset will cost on disk, and a refusal to start when it will not fit.

Hidden states dominate: tokens x layers x hidden x bytes (SmolLM2: 4 x 576 x 2 B =
4.6 KB per token; capture.storage=fp8: 3 x (576 + 2) + 576 x 2 = 2.9 KB). Running out of disk hours into an extraction is the failure to avoid;
when it happens anyway (another job filled the disk), the write that failed says so.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from eagle3.store.layout import StoreError
from eagle3.store.storage_format import StorageFormat

_PER_SHARD_OVERHEAD = 4096  # safetensors header + JSON metadata, generously


class DiskSpaceError(StoreError):
    pass


# what a write's error says where the writer does not pass errno on: torch.save's C++ writer, and
# safetensors' Rust one ("I/O error: No space left on device (os error 28)"; 122: a quota)
_WRITE_FAILED = ("file write failed", "unexpected pos", "(os error 28)", "(os error 122)")


def disk_full(e: BaseException) -> bool:
    """A write's error that is the disk: ENOSPC or EDQUOT, or torch.save's or safetensors'
    writer failing to write (their errors carry no errno)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, Exception) and any(m in str(e) for m in _WRITE_FAILED)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError  # unreachable


def disk_needed_bytes(
    num_tokens: int,
    num_layers: int,
    hidden_size: int,
    dtype: torch.dtype,
    num_samples: int = 0,
    shard_max_tokens: int = 65536,
    storage: StorageFormat = StorageFormat(),
) -> int:
    """Bytes for ``num_tokens`` tokens: hidden states in ``storage``'s format (fp8: about half)
    + ids (8 B) + mask (1 B) + offsets."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    per_token = storage.bytes_per_token(num_layers, hidden_size, itemsize) + 8 + 1
    shards = max(1, -(-int(num_tokens) // max(1, int(shard_max_tokens))))
    return int(num_tokens) * per_token + 8 * (int(num_samples) + shards) + _PER_SHARD_OVERHEAD * shards


def _existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int:
    return shutil.disk_usage(_existing_ancestor(Path(path))).free


_DATASET_HINT = (
    "Lower data.max_samples or data.max_length, capture fewer layers, or point paths.datasets_dir at a larger disk."
)


def check_free_disk(path: str | Path, need_bytes: int, margin: float = 1.1, hint: str = _DATASET_HINT) -> int:
    """Raise ``DiskSpaceError`` unless ``path``'s filesystem has need x margin free; ``hint``
    says what to change (a dataset's by default).

    Returns the free bytes. ``path`` need not exist yet (its nearest existing parent is
    measured).
    """
    free = free_bytes(path)
    want = int(need_bytes * margin)
    if free < want:
        raise DiskSpaceError(
            f"{path}: not enough disk: need {format_bytes(want)} ({format_bytes(need_bytes)} x "
            f"margin {margin}), free {format_bytes(free)}. {hint}"
        )
    return free


@contextmanager
def disk_full_as_error(path: str | Path, need_bytes: int | Callable[[], int]) -> Iterator[None]:
    """Turn a full disk or quota (ENOSPC, EDQUOT) while writing ``path`` into a
    ``DiskSpaceError`` that names the file, the bytes it needed (a callable: computed only
    then) and what is free."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if callable(need_bytes):
            need_bytes = need_bytes()
        raise DiskSpaceError(
            f"{path}: disk full ({e.strerror}) writing it: needs {format_bytes(need_bytes)} ({int(need_bytes)} bytes), "
            f"{format_bytes(free_bytes(path))} free"
        ) from e
