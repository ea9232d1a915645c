"""A shard's captured states encoded on a device (a GPU), a chunk of samples at a time.

vLLM's capture hands its states over on the host (its connector files). Encoded on the GPU sample
by sample, each sample cost a copy there, the format's handful of kernels and a wait for the copies
back (about a millisecond each), which held vLLM's capture far below exact's rate on an H100
(docs/records/2026-12-05-storage-formats.md). Here the samples of a
chunk are copied into one device buffer, encoded by one call, and copied back once. Each token's
rows are encoded on their own (StorageFormat.encode), so a chunk's tensors are its samples'
tensors concatenated, bit for bit, and the shard file is the one the per-sample encode writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from eagle3.store.storage_format import StorageFormat
from eagle3.store.teacher_topk import TeacherProjection

# captured bytes a chunk holds on the device: 58k tokens of SmolLM2's 4 x 576 bf16 states, 8k of
# Llama-3.1-8B's 4 x 4,096; the encode's fp32 temporaries take about twice that beside vLLM's engine
CHUNK_BYTES = 256 << 20


def encoded_parts(
    hiddens: Sequence[torch.Tensor | Mapping[str, torch.Tensor]],
    storage: StorageFormat,
    teacher: TeacherProjection | None,
    device: torch.device | None,
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, list[torch.Tensor]]:
    """Per tensor name of ``storage``, the host pieces whose concatenation (in order) is the
    samples' encoded tensors concatenated. A sample is its hidden [T, L, H] as captured (encoded
    here: on ``device`` a chunk of samples at a time, or where it lies when ``device`` is None) or
    that format's tensors already (encoded on the capture device), kept as they are."""
    parts: dict[str, list[torch.Tensor]] = {}
    run: list[torch.Tensor] = []  # consecutive captured samples waiting for the device
    run_bytes = 0

    def add(tensors: Mapping[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            parts.setdefault(name, []).append(t)

    def flush() -> None:
        nonlocal run_bytes
        if run:
            add(_encode_chunk(run, storage, teacher, device))
        run.clear()
        run_bytes = 0

    for h in hiddens:
        if isinstance(h, Mapping):
            flush()
            add(h)
        elif device is None or storage.is_exact:
            flush()
            add(storage.encode(h, teacher))
        else:
            nbytes = h.numel() * h.element_size()
            if run and run_bytes + nbytes > chunk_bytes:
                flush()
            run.append(h)
            run_bytes += nbytes
    flush()
    return parts


def _encode_chunk(
    hiddens: list[torch.Tensor], storage: StorageFormat, teacher: TeacherProjection | None, device: torch.device | None
) -> dict[str, torch.Tensor]:
    """Samples' hidden [T_i, L, H] (host) copied into one [sum T_i, L, H] buffer on ``device``,
    encoded there, the format's tensors back on the host."""
    tail, dtype = hiddens[0].shape[1:], hiddens[0].dtype
    x = torch.empty((sum(int(h.shape[0]) for h in hiddens), *tail), dtype=dtype, device=device)  # [N, L, H]
    a = 0
    for h in hiddens:  # straight into the buffer: no concatenation on the host first
        x[a : a + h.shape[0]].copy_(h, non_blocking=True)
        a += h.shape[0]
    return {name: t.to("cpu") for name, t in storage.encode(x, teacher).items()}
