"""The writer threads' encode on a device, a chunk of samples at a time (eagle3/store/device_encode.py):
the pieces concatenate to what encoding each sample gives, bit for bit, whatever the chunk size and
however captured and already-encoded samples mix; through the real ShardWriter the shard files are
the per-sample encode's, byte for byte. Here the device is the CPU, running the same chunked code a
GPU runs (tests/unit/store/test_storage_device.py and tests/unit/store/test_teacher_topk.py run it on CUDA)."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    ENCODED_STORAGES,
    sha256_of,
    teacher_projection,
    teacher_states,
    wide_range_samples,
    write_in_storage,
)

from eagle3.store.device_encode import encoded_parts
from eagle3.store.storage_format import StorageFormat
from eagle3.store.teacher_topk import TeacherProjection


def per_sample(hiddens, storage: StorageFormat, teacher=None) -> dict[str, torch.Tensor]:
    """What encoding each sample on its own and concatenating gives."""
    each = [storage.encode(h, teacher) for h in hiddens]
    return {name: torch.cat([e[name] for e in each]) for name in each[0]}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (an fp8 or bf16 NaN compares equal to itself here)."""
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("storage", ENCODED_STORAGES, ids=str)
@pytest.mark.parametrize("chunk_bytes", [1, 20_000, 1 << 30])
def test_chunks_concatenate_to_the_per_sample_encode(storage, chunk_bytes):
    hiddens = [r.states() for r in wide_range_samples(7).values()]
    parts = encoded_parts(hiddens, storage, None, torch.device("cpu"), chunk_bytes=chunk_bytes)
    n_chunks = {1: 7, 20_000: None, 1 << 30: 1}[chunk_bytes]
    if n_chunks is not None:
        assert all(len(p) == n_chunks for p in parts.values())
    else:
        assert 1 < len(parts["hidden_aux"]) < 7  # several samples a chunk, several chunks
    want = per_sample(hiddens, storage)
    assert set(parts) == set(want)
    for name, t in want.items():
        got = torch.cat(parts[name])
        assert got.dtype == t.dtype and got.shape == t.shape and got.device.type == "cpu", name
        assert torch.equal(bits(got), bits(t)), name


def test_the_teachers_top_k_and_encoded_samples_keep_their_places():
    """A sample that comes encoded (the HF capture's device encode) between captured ones: the
    captured runs around it are chunked, the order of the shard's rows kept."""
    p = teacher_projection()
    hiddens = [teacher_states(5 + 3 * i, seed=i) for i in range(6)]
    mixed = list(hiddens)
    top_k = StorageFormat("fp8", p.k)
    mixed[2] = top_k.encode(hiddens[2], p)
    parts = encoded_parts(mixed, top_k, p, torch.device("cpu"), chunk_bytes=1 << 30)
    assert len(parts["teacher_ids"]) == 3  # samples 0-1, the encoded 2, samples 3-5
    want = per_sample(hiddens, top_k, p)
    for name, t in want.items():
        assert torch.equal(bits(torch.cat(parts[name])), bits(t)), name


@pytest.mark.parametrize("storage", ENCODED_STORAGES, ids=str)
def test_the_writer_encoding_by_chunks_writes_the_per_sample_shard_files(tmp_path, storage):
    records = wide_range_samples()
    host = write_in_storage(tmp_path / "host", records, storage)
    chunked = write_in_storage(tmp_path / "chunked", records, storage, background=True, encode_device="cpu")
    assert len(host.shards) > 2 and host.shards == chunked.shards
    for a in host.shards:
        assert sha256_of(tmp_path / "host" / a.file) == sha256_of(tmp_path / "chunked" / a.file) == a.sha256


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_gpu_projection_on_the_tensor_cores_gives_the_fp32_top_k():
    """On CUDA the bf16 lm_head's logits come from torch.mm with fp32 out: the top-k of the fp32
    matmul (the ids, the log-probabilities within fp16's rounding)."""
    p = teacher_projection(chunk_tokens=64).to("cuda")
    z = teacher_states(500, seed=3)[:, -1].cuda()  # [T, H]
    ids, top = p.topk(z)
    host = teacher_projection(chunk_tokens=64)  # the fp32 route: the same weights, lm_head upcast (its bf16 values)
    fp32 = TeacherProjection(host.norm_weight.cuda(), host.eps, host.lm_head.float().cuda(), host.k, chunk_tokens=64)
    want_ids, want_top = fp32.topk(z)
    assert (ids == want_ids).float().mean() > 0.99
    assert torch.equal(ids[:, 0], want_ids[:, 0])
    torch.testing.assert_close(top.float(), want_top.float(), rtol=2e-3, atol=2e-3)
