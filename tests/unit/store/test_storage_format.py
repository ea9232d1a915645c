"""capture.storage=fp8: the aux hidden states in float8_e4m3fn with a scale per token and layer,
the final layer exact; the format in the shards, the manifest, the fingerprint, a merge and the
disk estimate; an exact dataset of before the field still reads (real runs:
integration/test_storage_format_runs.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import compose
from helpers.storage import DT, FP8, FP8_ROW_BOUND, INPUTS, INT4, LAYER_IDS, H, fp8_row_errors, wide_range_states
from safetensors import safe_open

from eagle3.store import (
    FingerprintMismatchError,
    HiddenStateDataset,
    ShardWriter,
    StoreError,
    dataset_fingerprint,
    disk_needed_bytes,
)
from eagle3.store.merge import merge_parts, part_dir
from eagle3.store.storage_format import StorageFormat
from eagle3.store.write_options import WriteOptions
from eagle3.target_model.adapter import CapturedSample


def test_fp8_error_is_bounded_per_token_and_layer_and_the_final_layer_is_exact():
    h = wide_range_states(12)
    h[3, 0] = 0  # an all-zero row: zeros back, not NaN
    enc = FP8.encode(h)
    assert enc["hidden_aux"].dtype == torch.float8_e4m3fn and list(enc["hidden_aux"].shape) == [12, 2, H]
    assert enc["hidden_aux_scale"].dtype == torch.bfloat16 and list(enc["hidden_aux_scale"].shape) == [12, 2]
    back = FP8.decode(enc, DT)
    assert back.dtype == DT and back.shape == h.shape
    assert torch.equal(back[:, -1], h[:, -1])  # the teacher's state, bit for bit
    assert torch.equal(back[3, 0], torch.zeros(H, dtype=DT))
    rel = fp8_row_errors(back, h)
    rel[3, 0] = 0
    assert float(rel.max()) <= FP8_ROW_BOUND  # every row, from 1e-3 to 1e3, at its own scale
    assert float(rel.max()) > 0.005  # and it is fp8: the bound is not vacuous
    # one scale for the whole tensor would flush the small rows to zero: the per-row scale keeps them
    assert float(back[0, 0].float().abs().max()) > 0


def test_an_fp8_dataset_round_trips_at_the_estimated_size(tmp_path):
    w = ShardWriter(
        tmp_path,
        layer_ids=LAYER_IDS,
        hidden_size=H,
        dtype=DT,
        fingerprint_inputs=INPUTS,
        write=WriteOptions(shard_max_tokens=40),
        storage=FP8,
    )
    want = {}
    for i in range(8):
        T = 5 + 3 * i
        want[f"s{i}"] = CapturedSample(torch.arange(T), torch.arange(T) % 2 == 0, wide_range_states(T, seed=i))
        w.add(f"s{i}", want[f"s{i}"])
    m = w.finish(torch.arange(50), {})
    assert m.storage == FP8 and json.loads((tmp_path / "manifest.json").read_text())["storage"] == "fp8"
    with safe_open(str(tmp_path / m.shards[0].file), framework="pt") as f:
        assert f.metadata()["storage"] == "fp8"
        assert set(f.keys()) == {"input_ids", "loss_mask", "hidden_aux", "hidden_aux_scale", "hidden_final", "offsets"}
    ds = HiddenStateDataset(tmp_path, verify="full")
    assert ds.storage == FP8
    for i in range(len(ds)):
        got, ref = ds[i], want[ds.sample_id(i)]
        assert got["hidden"].dtype == DT and torch.equal(got["input_ids"], ref.token_ids)
        assert torch.equal(got["hidden"][:, -1], ref.hidden[:, -1])
        assert float(fp8_row_errors(got["hidden"], ref.hidden).max()) <= FP8_ROW_BOUND
    # the disk check's figure holds the shards, and is fp8's, not bf16's
    on_disk = sum(s.size_bytes for s in m.shards)
    need = disk_needed_bytes(m.num_tokens, 3, H, DT, m.num_samples, 40, FP8)
    assert on_disk <= need < disk_needed_bytes(m.num_tokens, 3, H, DT, m.num_samples, 40)


def test_reopening_with_another_storage_is_refused_by_name(tmp_path):
    kw = dict(layer_ids=LAYER_IDS, hidden_size=H, dtype=DT, fingerprint_inputs=INPUTS)
    with ShardWriter(tmp_path, storage=FP8, **kw) as w:
        w.add("a", CapturedSample(torch.arange(4), torch.ones(4, dtype=torch.bool), wide_range_states(4)))
    with pytest.raises(FingerprintMismatchError, match="storage: expected exact, got fp8"):
        ShardWriter(tmp_path, **kw)
    with pytest.raises(StoreError, match="storage: expected a StorageFormat .*got 'fp8'"):
        ShardWriter(tmp_path / "other", storage="fp8", **kw)  # the config's string: built once, by the caller
    with pytest.raises(StoreError, match="int4 groups 32 channels: expected a hidden size divisible by it, got 40"):
        ShardWriter(tmp_path / "narrow", storage=INT4, **{**kw, "hidden_size": 40})


def _write(directory: Path, storage: str, ids: range) -> None:
    kw = dict(layer_ids=LAYER_IDS, hidden_size=H, dtype=DT, fingerprint_inputs=INPUTS)
    w = ShardWriter(directory, storage=StorageFormat(storage), **kw)
    for i in ids:
        w.add(f"s{i}", CapturedSample(torch.arange(6), torch.ones(6, dtype=torch.bool), wide_range_states(6, seed=i)))
    w.finish(torch.arange(50), {})


def test_a_manifest_without_the_field_reads_as_exact(tmp_path):
    _write(tmp_path, "exact", range(3))
    path = tmp_path / "manifest.json"
    raw = json.loads(path.read_text())
    assert raw.pop("storage") == "exact"
    path.write_text(json.dumps(raw))  # as written before the field existed
    ds = HiddenStateDataset(tmp_path, verify="full")
    assert ds.storage == StorageFormat() and torch.equal(ds[0]["hidden"], wide_range_states(6, seed=0))
    with safe_open(str(tmp_path / raw["shards"][0]["file"]), framework="pt") as f:
        assert "storage" not in f.metadata()  # exact shards are byte for byte those of before


def test_a_merge_of_mixed_formats_is_refused_by_name(tmp_path):
    final = tmp_path / f"ds-{dataset_fingerprint(INPUTS)}"
    _write(part_dir(final, 0, 2), "exact", range(0, 3))
    _write(part_dir(final, 1, 2), "fp8", range(3, 6))
    with pytest.raises(StoreError, match=r"part-1-of-2/manifest.json: storage: expected exact .*got fp8;"):
        merge_parts(final, 2)
    assert not final.exists()
    shutil.rmtree(part_dir(final, 0, 2))  # one format: merged, the format kept
    _write(part_dir(final, 0, 2), "fp8", range(0, 3))
    m = merge_parts(final, 2)
    assert m.storage == FP8 and len(HiddenStateDataset(final, verify="full")) == 6


def test_resolve_shows_bytes_per_token_and_the_dataset_size_of_the_format():
    from eagle3.planning.disk_estimate import disk_bytes
    from eagle3.store.disk import format_bytes

    cfg = compose("extract", ["data.max_samples=100"])  # a CPU: fp8 unless told otherwise
    assert cfg.capture.storage == "fp8" and cfg.capture.hidden_layout == "bfloat16 [T, 4, 576]"
    assert cfg.capture.storage_layout.startswith("fp8: aux float8_e4m3fn [T, 3, 576] + bfloat16 scale [T, 3]")
    # SmolLM2: 3 x (576 + 2) + 1152 + 9
    assert cfg.capture.bytes_per_token == "2,895 B (0.63x of exact bfloat16: 4,617 B)"
    ids, h, shard = list(cfg.layers.layer_ids), cfg.model.hidden_size, cfg.capture.shard_max_tokens
    size = disk_bytes(100 * cfg.data.max_length, ids, h, "bfloat16", shard, FP8)
    assert cfg.capture.dataset_disk == f"<= {format_bytes(size)} (100 samples x <= {cfg.data.max_length} tokens)"
    assert size < disk_bytes(100 * cfg.data.max_length, ids, h, "bfloat16", shard, StorageFormat())
    exact = compose("extract", ["capture.storage=exact"])
    assert exact.capture.storage_layout == "exact: hidden bfloat16 [T, 4, 576]"
    assert exact.capture.bytes_per_token == "4,617 B"
    # a GPU: the HF capture stores fp8 with the teacher's top-32 (0.42x), vLLM's capture exact (its
    # encode beside the engine not measured); an explicit storage takes no default top-k it cannot hold
    gpu = compose("extract", ["topology=gpu1"])
    assert (gpu.capture.storage, gpu.capture.teacher_topk) == ("fp8", 32)
    assert gpu.capture.bytes_per_token == "1,935 B (0.42x of exact bfloat16: 4,617 B)"
    gpu_vllm = compose("extract", ["topology=gpu1", "capture=vllm"])
    assert (gpu_vllm.capture.storage, gpu_vllm.capture.teacher_topk) == ("exact", None)
    gpu_exact = compose("extract", ["topology=gpu1", "capture.storage=exact"])
    assert (gpu_exact.capture.storage, gpu_exact.capture.teacher_topk) == ("exact", None)
    assert compose("extract", ["topology=gpu1", "capture.storage=int4"]).capture.teacher_topk == 32
    assert compose("extract", ["capture.storage=int4"]).capture.teacher_topk is None  # a CPU: the final layer


# ---------------------------------------------------------------- end to end (tiny random target)


def test_the_int4_option_round_trips_at_under_half_the_bytes(tmp_path):
    """Not a default: 4-bit codes with a bf16 scale per 32 channels; error within half a step."""
    w = ShardWriter(tmp_path, layer_ids=LAYER_IDS, hidden_size=H, dtype=DT, fingerprint_inputs=INPUTS, storage=INT4)
    want = {
        f"s{i}": CapturedSample(torch.arange(9), torch.ones(9, dtype=torch.bool), wide_range_states(9, seed=i))
        for i in range(4)
    }
    for sid, sample in want.items():
        w.add(sid, sample)
    m = w.finish(torch.arange(50), {})
    ds = HiddenStateDataset(tmp_path, verify="full")
    assert m.storage == ds.storage == INT4
    for i in range(len(ds)):
        got, ref = ds[i]["hidden"], want[ds.sample_id(i)].hidden
        assert torch.equal(got[:, -1], ref[:, -1])
        g = ref[:, :-1].float().reshape(9, 2, H // 32, 32)
        err = (got[:, :-1].float().reshape(9, 2, H // 32, 32) - g).abs().amax(-1)
        assert bool((err <= g.abs().amax(-1) * (0.5 / 7 + 2**-7) + 1e-30).all())  # half a step of its group
    need = disk_needed_bytes(m.num_tokens, 3, H, DT, m.num_samples, storage=INT4)
    assert sum(s.size_bytes for s in m.shards) <= need
    # SmolLM2's 4 layers: 3 x (288 + 36) + 1152 = 2,124 bytes of states against 4,608
    assert INT4.bytes_per_token(4, 576, 2) == 2124 and StorageFormat().bytes_per_token(4, 576, 2) == 4608
