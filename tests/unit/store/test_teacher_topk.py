"""capture.teacher_topk: the teacher's top-k ids and log-probabilities stored in place of the final
layer; the projection, the shards, the reader and both loader routes, the manifest, the
fingerprint, a merge, the config (real runs: integration/test_teacher_topk_runs.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import compose
from helpers.teacher import DT, INPUTS, LAYER_IDS, H, K, V, teacher_projection, teacher_states
from safetensors import safe_open

from eagle3.store import FingerprintMismatchError, HiddenStateDataset, ShardWriter, StoreError, dataset_fingerprint
from eagle3.store.batch_options import BatchShape
from eagle3.store.merge import merge_parts, part_dir
from eagle3.store.packing import decode_hidden, pack_rows, packed_loader
from eagle3.store.storage_format import StorageFormat
from eagle3.store.teacher_topk import TeacherProjection
from eagle3.store.write_options import WriteOptions
from eagle3.target_model.adapter import CapturedSample


def reference(final: torch.Tensor, p: TeacherProjection) -> tuple[torch.Tensor, torch.Tensor]:
    """top-k of log_softmax(lm_head(norm(z))), written out directly (Llama's RMSNorm)."""
    z = final.float()
    normed = (p.norm_weight * (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + p.eps)).to(DT)).to(DT)
    logp = torch.log_softmax(normed.float() @ p.lm_head.float().T, dim=-1)
    top, ids = torch.topk(logp, p.k, dim=-1)
    return ids, top


@pytest.mark.parametrize("storage", ["fp8", "int4"])
def test_the_stored_top_k_is_the_teachers(storage):
    h, p = teacher_states(23), teacher_projection()
    top_k, plain_format = StorageFormat(storage, K), StorageFormat(storage)
    enc = top_k.encode(h, p)
    assert "hidden_final" not in enc
    assert enc["teacher_ids"].dtype == torch.int32 and list(enc["teacher_ids"].shape) == [23, K]
    assert enc["teacher_logprobs"].dtype == torch.float16 and list(enc["teacher_logprobs"].shape) == [23, K]
    ids, top = reference(h[:, -1], p)
    assert torch.equal(enc["teacher_ids"].long(), ids)
    torch.testing.assert_close(enc["teacher_logprobs"].float(), top, rtol=1e-3, atol=1e-3)  # fp16
    lp = enc["teacher_logprobs"].float()
    assert bool((lp[:, 1:] <= lp[:, :-1]).all()) and float(lp.exp().sum(-1).max()) <= 1.0 + 1e-3
    # the aux layers are those of the format without the top-k, bit for bit
    plain = plain_format.encode(h)
    assert torch.equal(top_k.decode_aux(enc, DT), plain_format.decode(plain, DT)[:, :-1])
    with pytest.raises(ValueError, match="expected rows with the final layer"):
        top_k.decode(enc, DT)
    # a batch [B, T, L, H] encodes as its samples do
    both = top_k.encode(torch.stack([h[:20], teacher_states(20, 1)]), p)
    assert torch.equal(both["teacher_ids"][0], enc["teacher_ids"][:20])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_writer_encoding_on_the_gpu_stores_the_teachers_top_k(tmp_path):
    """vLLM's route on a GPU: the projection's weights on the GPU, the writer threads encoding
    there (encode_device); the aux layers bit for bit the host's, the top-k the teacher's."""
    from eagle3.store import HiddenStateDataset

    w = _writer(tmp_path, write=WriteOptions(40, background=True, encode_device="cuda"), teach=False)
    p = teacher_projection().to("cuda")
    w.set_teacher(p)
    want = {}
    for i in range(5):
        T = 5 + 3 * i
        want[f"s{i}"] = teacher_states(T, seed=i)
        w.add(f"s{i}", CapturedSample(torch.arange(T), torch.ones(T, dtype=torch.bool), want[f"s{i}"]))
    w.finish(torch.arange(V), {})
    ds = HiddenStateDataset(tmp_path, verify="full").encoded_rows()
    for j, (sid, h) in enumerate(want.items()):
        assert ds.sample_id(j) == sid
        rows = ds[j]
        ids, top = reference(h[:, -1], teacher_projection())
        assert torch.equal(rows["teacher_ids"].long(), ids), sid
        torch.testing.assert_close(rows["teacher_logprobs"].float(), top, rtol=2e-3, atol=2e-3)
        fp8 = StorageFormat("fp8")
        assert torch.equal(ds.storage.decode_aux(rows, DT), fp8.decode(fp8.encode(h), DT)[:, :-1])


def test_a_nan_log_probability_or_an_id_out_of_range_does_not_decode_finite():
    top_k = StorageFormat("fp8", K)
    enc = top_k.encode(teacher_states(6), teacher_projection())
    assert top_k.decodes_finite(enc, DT, V)
    bad = dict(enc, teacher_logprobs=enc["teacher_logprobs"].clone())
    bad["teacher_logprobs"][2, 3] = float("nan")
    assert not top_k.decodes_finite(bad, DT, V)
    far = dict(enc, teacher_ids=enc["teacher_ids"].clone())
    far["teacher_ids"][0, 0] = V
    assert top_k.decodes_finite(far, DT) and not top_k.decodes_finite(far, DT, V)


def test_k_and_the_projection_are_checked():
    with pytest.raises(ValueError, match=r"capture.teacher_topk: expected an integer in 1..300 .*got 0"):
        teacher_projection(k=0)
    with pytest.raises(ValueError, match=r"capture.teacher_topk: expected an integer in 1..300 .*got 301"):
        teacher_projection(k=V + 1)
    with pytest.raises(ValueError, match="encode: teacher: expected a projection with k=None for exact, got k=8"):
        StorageFormat().encode(teacher_states(2), teacher_projection())


def _writer(directory: Path, k: int | None = K, storage: str = "fp8", teach: bool = True, **kw) -> ShardWriter:
    w = ShardWriter(
        directory,
        layer_ids=LAYER_IDS,
        hidden_size=H,
        dtype=DT,
        fingerprint_inputs=INPUTS,
        storage=StorageFormat(storage, k),
        **kw,
    )
    if k is not None and teach:
        w.set_teacher(teacher_projection(k))
    return w


def _write(directory: Path, ids: range, k: int | None = K, storage: str = "fp8") -> dict[str, torch.Tensor]:
    w, want = _writer(directory, k, storage, write=WriteOptions(40, background=True)), {}
    for i in ids:
        T = 5 + 3 * i
        want[f"s{i}"] = teacher_states(T, seed=i)
        w.add(f"s{i}", CapturedSample(torch.arange(T), torch.arange(T) % 3 != 0, want[f"s{i}"]))
    w.finish(torch.arange(V), {})
    return want


@pytest.mark.parametrize("storage", ["fp8", "int4"])
def test_both_loader_routes_give_the_interface_keys(tmp_path, storage):
    want = _write(tmp_path, range(7), storage=storage)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["teacher_topk"] == K and m["storage"] == storage
    with safe_open(str(tmp_path / m["shards"][0]["file"]), framework="pt") as f:
        assert f.metadata()["teacher_topk"] == str(K)
        assert set(f.keys()) == {
            "input_ids",
            "loss_mask",
            "hidden_aux",
            "hidden_aux_scale",
            "teacher_ids",
            "teacher_logprobs",
            "offsets",
        }
    ds = HiddenStateDataset(tmp_path, verify="full")
    assert ds.storage == StorageFormat(storage, K)
    s = ds[0]
    assert set(s) == {"input_ids", "loss_mask", "aux_layers", "teacher_ids", "teacher_logprobs"}
    ids, _ = reference(want[ds.sample_id(0)][:, -1], teacher_projection())
    assert torch.equal(s["teacher_ids"], ids)
    idx = list(range(len(ds)))
    batches = pack_rows([int(t) for t in ds.lengths], 48, 24)
    cpu = list(packed_loader(ds, idx, batches, shape=BatchShape(48, 24, fixed_shape=True)))
    enc = ds.encoded_rows()
    gpu = [
        decode_hidden(b, ds.storage, DT)
        for b in packed_loader(enc, idx, batches, shape=BatchShape(48, 24, fixed_shape=True), split=False)
    ]
    assert len(cpu) == len(gpu) == len(batches)
    for a, b in zip(cpu, gpu):
        assert set(a) == set(b) and "final_hidden" not in a
        assert a["aux_hidden"].dtype == DT and list(a["aux_hidden"].shape) == [2, 24, 2 * H]
        assert a["teacher_ids"].dtype == torch.int64 and list(a["teacher_ids"].shape) == [2, 24, K]
        assert a["teacher_logprobs"].dtype == torch.float32 and list(a["teacher_logprobs"].shape) == [2, 24, K]
        for key in a:
            assert torch.equal(a[key], b[key]), key
        pad = a["segment_ids"] < 0
        assert bool(pad.any()) and not bool(a["teacher_ids"][pad].any()) and not bool(a["teacher_logprobs"][pad].any())
    with pytest.raises(ValueError, match="expected rows with the final layer"):
        ds.storage.decode(ds.encoded_rows()[0] | {}, DT)


def test_a_damaged_log_probability_is_refused_by_the_reader(tmp_path):
    _write(tmp_path, range(2))
    ds = HiddenStateDataset(tmp_path)
    shard = tmp_path / ds.manifest.shards[0].file
    with safe_open(str(shard), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    tensors["teacher_logprobs"][1, 0] = float("inf")
    from safetensors.torch import save_file

    save_file(tensors, str(shard), metadata=meta)
    with pytest.raises(StoreError, match="teacher_logprobs / teacher_ids: expected finite"):
        HiddenStateDataset(tmp_path)[0]


def test_k_is_in_the_identity_the_manifest_and_a_merge(tmp_path):
    _write(tmp_path / "a", range(2))
    with pytest.raises(FingerprintMismatchError, match=r"storage: expected fp8\+top4, got fp8\+top8"):
        _writer(tmp_path / "a", k=4)
    with pytest.raises(ValueError, match="teacher_topk: expected null with capture.storage=exact"):
        _writer(tmp_path / "b", storage="exact")
    w = _writer(tmp_path / "c", k=4)
    with pytest.raises(StoreError, match=r"set_teacher: expected a projection with k=4 .*got k=8"):
        w.set_teacher(teacher_projection(K))
    w.close()
    # a writer with k but no projection refuses captured states rather than writing the final layer
    bare = _writer(tmp_path / "d", teach=False)
    with pytest.raises(StoreError, match=r"sample 'x' teacher: expected the target's projection \(set_teacher\)"):
        bare.add("x", CapturedSample(torch.arange(3), torch.ones(3, dtype=torch.bool), teacher_states(3)))
    bare.close()


def test_an_old_manifest_reads_as_holding_the_final_layer(tmp_path):
    _write(tmp_path, range(3), k=None)
    path = tmp_path / "manifest.json"
    raw = json.loads(path.read_text())
    assert raw.pop("teacher_topk") is None
    path.write_text(json.dumps(raw))  # as written before the field existed
    ds = HiddenStateDataset(tmp_path, verify="full")
    assert ds.storage == StorageFormat("fp8") and ds[0]["hidden"].shape == (5, 3, H)
    with safe_open(str(tmp_path / raw["shards"][0]["file"]), framework="pt") as f:
        assert "teacher_topk" not in f.metadata()  # shards with the final layer are those of before


def test_a_merge_of_mixed_teacher_topk_is_refused_by_name(tmp_path):
    final = tmp_path / f"ds-{dataset_fingerprint(INPUTS)}"
    _write(part_dir(final, 0, 2), range(0, 3), k=None)
    _write(part_dir(final, 1, 2), range(3, 6))
    with pytest.raises(StoreError, match=r"part-1-of-2/manifest.json: storage: expected fp8 .*got fp8\+top8;"):
        merge_parts(final, 2)
    shutil.rmtree(part_dir(final, 0, 2))
    _write(part_dir(final, 0, 2), range(0, 3))  # one k: merged, the k kept
    m = merge_parts(final, 2)
    assert m.storage.teacher_topk == K and HiddenStateDataset(final, verify="full")[5]["teacher_ids"].shape == (20, K)


# ---------------------------------------------------------------- config and identity


def test_the_config_refuses_exact_storage_and_k_outside_the_vocab_by_name():
    from eagle3.config.schema import run_config

    cfg = compose("extract", ["capture.storage=fp8", "capture.teacher_topk=32"])
    assert cfg.capture.storage_layout.endswith(
        "teacher top-32: ids int32 [T, 32] + log-probabilities float16 [T, 32] (no final layer)"
    )
    # SmolLM2: 3 x (576 + 2) + 32 x 6 + 9
    assert cfg.capture.bytes_per_token == "1,935 B (0.42x of exact bfloat16: 4,617 B)"
    int4 = compose("extract", ["capture.storage=int4", "capture.teacher_topk=32"])
    assert int4.capture.bytes_per_token == "1,173 B (0.25x of exact bfloat16: 4,617 B)"
    for overrides, message in (
        (
            ["capture.storage=exact", "capture.teacher_topk=32"],
            "capture.teacher_topk: expected null with capture.storage=exact",
        ),
        (["capture.teacher_topk=0"], "capture.teacher_topk: expected null or an integer >= 1, got 0"),
        (["capture.teacher_topk=49153"], r"capture.teacher_topk: expected an integer in 1..49152 \(model.vocab_size\)"),
    ):
        with pytest.raises(Exception, match=message):
            run_config(compose("extract", overrides))


def test_k_is_in_the_fingerprint():
    from eagle3.config.schema import run_config
    from eagle3.extraction.identity import fingerprint_inputs, token_fingerprint_inputs
    from eagle3.stages.narrow import dataset_identity
    from eagle3.target_model.resolve import resolve_target

    def inputs(*overrides: str):
        run = run_config(compose("extract", ["experiment=tiny_test", "capture.storage=fp8", *overrides]))
        identity = dataset_identity(run, resolve_target(run.model, run.paths.cache_dir))
        return fingerprint_inputs(identity), token_fingerprint_inputs(identity)

    (plain, online), (k32, online32), (k16, _) = (
        inputs(),
        inputs("capture.teacher_topk=32"),
        inputs("capture.teacher_topk=16"),
    )
    assert "teacher_topk" not in plain and k32["teacher_topk"] == 32  # datasets named before keep their names
    assert len({dataset_fingerprint(x) for x in (plain, k32, k16)}) == 3
    assert online == online32  # online stores no states


# ---------------------------------------------------------------- the real target
