"""Captured samples whose rows span 6 orders of magnitude (what the fp8/int4 storage formats must
keep), written through the real ShardWriter in a storage format; a file's hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from eagle3.store import ShardWriter
from eagle3.store.storage_format import FP8_MAX, StorageFormat
from eagle3.store.write_options import WriteOptions
from eagle3.target_model.records import CapturedSample

# the samples' captured layer ids, hidden size, dtype and target vocabulary
LAYER_IDS = (1, 2, 4)
H = 64
DT = torch.bfloat16
VOCAB = 50
INPUTS = {"model": "tiny", "layer_ids": list(LAYER_IDS), "dtype": "bfloat16"}
FP8, INT4 = StorageFormat("fp8"), StorageFormat("int4")
ENCODED_STORAGES = (FP8, INT4)  # parametrize with ids=str
# e4m3 keeps 3 mantissa bits: a value in the top binade [256, 448] of a row scaled to 448 is off
# by at most half a step (16), so every element by at most amax x 16/448 (+ bf16's last rounding)
FP8_ROW_BOUND = 16 / FP8_MAX + 2**-8


def wide_range_states(T: int, seed: int = 0, dtype: torch.dtype = DT) -> torch.Tensor:
    """[T, L, H] whose rows differ in magnitude by 6 orders (an attention-sink-like row 1e3)."""
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.linspace(-3, 3, T * len(LAYER_IDS)).reshape(T, len(LAYER_IDS), 1)
    return (torch.randn(T, len(LAYER_IDS), H, generator=g) * scale).to(dtype)


def fp8_row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Per token and aux layer of [T, L, H] states: the largest error over H, as a fraction of the
    row's amax (the final layer, stored exact, left out)."""
    err = (got[:, :-1].float() - want[:, :-1].float()).abs().amax(-1)
    return err / want[:, :-1].float().abs().amax(-1)


def wide_range_samples(n: int = 7) -> dict[str, CapturedSample]:
    """s0..s{n-1}: 4 + 5 i tokens each, a random loss mask, wide_range_states."""
    g = torch.Generator().manual_seed(1)
    out = {}
    for i in range(n):
        T = 4 + 5 * i
        out[f"s{i}"] = CapturedSample(
            torch.randint(0, VOCAB, (T,), generator=g), torch.rand(T, generator=g) > 0.3, wide_range_states(T, seed=i)
        )
    return out


def write_in_storage(
    directory: Path,
    records: dict[str, CapturedSample],
    storage: StorageFormat,
    background: bool = False,
    encode_device=None,
):
    """``records`` written by a ShardWriter of 2 writer threads in ``storage``, shards of 40 tokens
    at most, s1 the validation split; the manifest."""
    w = ShardWriter(
        directory,
        layer_ids=LAYER_IDS,
        hidden_size=H,
        dtype=DT,
        fingerprint_inputs=INPUTS,
        write=WriteOptions(40, background=background, writer_threads=2, encode_device=encode_device),
        storage=storage,
    )
    for sid, r in records.items():
        w.add(sid, r)
    return w.finish(torch.arange(VOCAB), {}, val_ids=["s1"])


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
