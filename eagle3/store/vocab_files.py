"""token_freq.safetensors and vocab-<V>.safetensors: checked on write and on read; add_vocab
adds a vocabulary of another size to a finished dataset."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle3.store.layout import LOCK, Manifest, StoreError, save_tensors_atomic, vocab_name
from eagle3.util.locks import DirLock, lock_wait_s


@dataclass(frozen=True)
class DraftVocabs:
    """The vocabulary files a dataset carries: the token counts and the draft vocabularies built
    from them (token_freq.safetensors, vocab-<V>.safetensors)."""

    token_freq: torch.Tensor  # int64 [target vocab]: loss-masked tokens counted per target id
    # draft vocabulary size V -> (d2t int64 [V], t2d bool [target vocab]): check_vocab's pair
    vocabs: Mapping[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def check_token_freq(freq: torch.Tensor) -> torch.Tensor:
    if not isinstance(freq, torch.Tensor) or freq.dim() != 1:
        raise StoreError(f"token_freq: expected a 1-D tensor [target vocab], got {getattr(freq, 'shape', type(freq))}")
    if freq.dtype.is_floating_point or freq.dtype == torch.bool:
        raise StoreError(f"token_freq: expected integer counts, got {freq.dtype}")
    if bool((freq < 0).any()):
        raise StoreError("token_freq: expected non-negative counts, got negative entries")
    return freq.to(torch.int64).contiguous()


def check_vocab(draft_vocab_size: int, d2t: torch.Tensor, t2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t int64 [V] (offsets: target id = i + d2t[i]); t2d bool [target vocab] with V trues."""
    V = int(draft_vocab_size)
    if d2t.dim() != 1 or d2t.shape[0] != V:
        raise StoreError(f"vocab-{V} d2t: expected shape [{V}], got {list(d2t.shape)}")
    if t2d.dim() != 1 or t2d.dtype != torch.bool:
        raise StoreError(f"vocab-{V} t2d: expected a 1-D bool mask, got {list(t2d.shape)} {t2d.dtype}")
    if int(t2d.sum()) != V:
        raise StoreError(f"vocab-{V} t2d: expected {V} true entries, got {int(t2d.sum())}")
    target_ids = torch.arange(V, dtype=torch.int64) + d2t.to(torch.int64)
    if bool((target_ids < 0).any()) or bool((target_ids >= t2d.shape[0]).any()):
        raise StoreError(f"vocab-{V} d2t: target ids out of range 0..{t2d.shape[0] - 1}")
    if not torch.equal(target_ids, t2d.nonzero().flatten()):
        raise StoreError(f"vocab-{V}: d2t and t2d disagree (expected d2t to map onto t2d's true ids, in order)")
    return d2t.to(torch.int64).contiguous(), t2d.contiguous()


def save_token_freq(path: Path, freq: torch.Tensor) -> None:
    save_tensors_atomic(path, {"token_freq": check_token_freq(freq)})


def save_vocab(path: Path, draft_vocab_size: int, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    d2t, t2d = check_vocab(draft_vocab_size, d2t, t2d)
    save_tensors_atomic(path, {"d2t": d2t, "t2d": t2d})


def load_tensors(path: Path, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        loaded = load_file(str(path))
    except FileNotFoundError:
        raise StoreError(f"{path}: missing (re-run extract.py to rebuild it)") from None
    except Exception as e:
        raise StoreError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    if set(loaded) != set(names):
        raise StoreError(f"{path}: tensors: expected {sorted(names)}, got {sorted(loaded)}")
    return loaded


def add_vocab(directory: str | Path, draft_vocab_size: int, d2t: torch.Tensor, t2d: torch.Tensor) -> Path:
    """Add a draft vocabulary of another size to a complete dataset (e.g. a train-time V)."""
    directory = Path(directory)
    # the dataset writer's lock: waits for a running extraction (or repair) to finish
    with DirLock(directory / LOCK, f"{directory}: an extraction is writing this dataset", wait_s=lock_wait_s()):
        m = Manifest.read(directory)
        if not m.complete:
            raise StoreError(f"{directory}: incomplete dataset; finish extract.py before adding vocabularies")
        path = directory / vocab_name(draft_vocab_size)
        save_vocab(path, draft_vocab_size, d2t, t2d)
        m.vocabs[str(int(draft_vocab_size))] = path.name
        m.write(directory)
        return path
