"""A dataset for online training: the samples' token ids and loss masks, no hidden states.

    manifest.json          the same Manifest as a stored dataset, hidden_states "online":
                           layer ids, hidden size and dtype say what the trainer will capture
    tokens.safetensors     input_ids int64 [Ttot], loss_mask bool [Ttot], offsets int64 [n+1]
    token_freq.safetensors, vocab-<V>.safetensors   as in a stored dataset

It costs 9 bytes per token, against 2 x L x H per token for stored hidden states (18 KB for
Llama-3.1-8B's 4 x 4096 bf16): the regeneration, the split and the draft vocabulary are
settled once, on disk, and the target recomputes the states as training reads the samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from eagle3.store.fingerprint import canonical, dataset_fingerprint
from eagle3.store.layout import (
    LOCK,
    ONLINE,
    TOKEN_FREQ,
    TOKENS,
    Manifest,
    ShardInfo,
    StoreError,
    dtype_name,
    file_sha256,
    save_tensors_atomic,
    vocab_name,
)
from eagle3.store.reader import HiddenStateDataset, SampleFiles
from eagle3.store.vocab_files import DraftVocabs, save_token_freq, save_vocab
from eagle3.util.locks import DirLock


class TokenDataset(SampleFiles):
    """A complete online dataset. ``ds[i]`` -> dict(input_ids int64 [T], loss_mask bool [T],
    sample_id str): the trainer's target adds ``hidden`` [T, L, H]."""

    kind = ONLINE

    def __getitem__(self, i: int) -> dict[str, Any]:
        row: dict[str, Any] = self._rows(i, ("input_ids", "loss_mask"))
        row["sample_id"] = self.sample_id(i % len(self))
        return row


def open_dataset(directory: str | Path) -> HiddenStateDataset | TokenDataset:
    """The dataset in ``directory`` as the reader its manifest names."""
    kind = Manifest.read(Path(directory)).hidden_states
    return TokenDataset(directory) if kind == ONLINE else HiddenStateDataset(directory)


def write_token_dataset(
    directory: str | Path,
    samples: Sequence[tuple[str, torch.Tensor, torch.Tensor]],
    *,
    val_ids: Sequence[str],
    fingerprint_inputs: Mapping[str, Any],
    layer_ids: Sequence[int],
    hidden_size: int,
    dtype: torch.dtype,
    vocab: DraftVocabs,
    provenance: Mapping[str, Any] | None = None,
    lock: DirLock | None = None,
) -> Manifest:
    """Write (sample_id, input_ids [T], loss_mask [T]) samples as one online dataset: the
    sample file, token counts and draft vocabularies (``vocab``) first, the manifest last (complete), each by
    temp file + rename, under the dataset's lock (``lock``: held by the caller already); a kill
    at any point leaves no manifest that lists a missing file, and a re-run writes it again."""
    directory = Path(directory)
    if not samples:
        raise StoreError(f"{directory}: no samples to write")
    ids = [str(s[0]) for s in samples]
    if len(set(ids)) != len(ids):
        raise StoreError(f"{directory}: sample ids: expected unique ids, got {len(ids) - len(set(ids))} repeated")
    missing_val = sorted(set(val_ids) - set(ids))
    if missing_val:
        raise StoreError(f"{directory}: val_ids: {len(missing_val)} not among the samples (first {missing_val[0]!r})")
    val = set(val_ids)
    inputs = canonical(dict(fingerprint_inputs))
    fingerprint = dataset_fingerprint(inputs)
    directory.mkdir(parents=True, exist_ok=True)
    owned = (
        nullcontext() if lock is not None and lock.held else DirLock(directory / LOCK, f"{directory}: being written")
    )
    with owned:
        input_ids = torch.cat([torch.as_tensor(s[1]).to(torch.int64) for s in samples])  # [Ttot]
        loss_mask = torch.cat([torch.as_tensor(s[2]).to(torch.bool) for s in samples])  # [Ttot]
        lengths = torch.tensor([int(s[1].shape[0]) for s in samples], dtype=torch.int64)  # [n]
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])  # [n+1]
        path = directory / TOKENS
        save_tensors_atomic(
            path,
            {"input_ids": input_ids, "loss_mask": loss_mask, "offsets": offsets},
            metadata={"fingerprint": fingerprint},
        )
        save_token_freq(directory / TOKEN_FREQ, vocab.token_freq)
        names = {}
        for size, (d2t, t2d) in vocab.vocabs.items():
            save_vocab(directory / vocab_name(size), size, d2t, t2d)
            names[str(int(size))] = vocab_name(size)
        manifest = Manifest(
            fingerprint=fingerprint,
            fingerprint_inputs=inputs,
            layer_ids=[int(i) for i in layer_ids],
            hidden_size=int(hidden_size),
            dtype=dtype_name(dtype),
            complete=True,
            shards=[
                ShardInfo(
                    file=TOKENS,
                    num_samples=len(samples),
                    num_tokens=int(input_ids.numel()),
                    num_loss_tokens=int(loss_mask.sum()),
                    size_bytes=path.stat().st_size,
                    sha256=file_sha256(path),
                )
            ],
            sample_ids=ids,
            val_ids=[i for i in ids if i in val],
            token_freq=TOKEN_FREQ,
            vocabs=names,
            provenance=dict(provenance or {}),
            hidden_states=ONLINE,
        )
        manifest.recount()
        manifest.write(directory)
    return manifest
