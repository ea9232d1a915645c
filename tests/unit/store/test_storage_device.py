"""capture.storage fp8/int4 encoded where the states are and decoded where the training runs
(issue #47): the encode of a GPU capture's batch, written through the real ShardWriter, makes the
shard files a CPU encode on the writer threads makes, byte for byte; a batch that travels encoded
and is decoded after the copy to the device equals the batch of samples a loader worker decoded,
bit for bit. Here the "device" is the CPU, running the same code the GPU runs (the fp8 decode's
float path included); tests/integration/test_hf_capture.py and tests/unit/training/test_gpu_batches.py run it on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.storage import (
    DT,
    ENCODED_STORAGES,
    FP8,
    INPUTS,
    INT4,
    LAYER_IDS,
    VOCAB,
    H,
    sha256_of,
    wide_range_samples,
    wide_range_states,
    write_in_storage,
)
from helpers.trainers import quiet_cpu_trainer

from eagle3.store import HiddenStateDataset, ShardWriter, StoreError
from eagle3.store.batch_options import BatchShape
from eagle3.store.packing import collate_rows, decode_hidden, split_hidden
from eagle3.store.reader import DamagedDatasetError
from eagle3.store.storage_format import FP8_MAX, StorageFormat
from eagle3.target_model.adapter import CaptureError, CaptureSpec, to_encoded_sample
from eagle3.target_model.records import CapturedSample, DeviceEncoding
from eagle3.training.datamodule import Eagle3DataModule


def batch_as_the_device_encodes_it(records: list[CapturedSample], storage: StorageFormat) -> list[CapturedSample]:
    """What HFCaptureBackend + BatchToHost do on a GPU, on this CPU: the samples right-padded into
    one [B, T, L, H] batch (padding holds huge values: it must not touch a real token's codes),
    encoded as a batch, each row's first t tokens made a record by to_encoded_sample."""
    lengths = [r.num_tokens for r in records]
    batch = torch.full((len(records), max(lengths), len(LAYER_IDS), H), 3e4, dtype=DT)  # [B, T, L, H]
    for b, r in enumerate(records):
        batch[b, : lengths[b]] = r.states()
    encoded = DeviceEncoding(storage, storage.encode).encode(batch)  # each [B, T, ...]
    out = []
    for b, r in enumerate(records):
        rows = {name: t[b, : lengths[b]] for name, t in encoded.items()}
        spec = CaptureSpec(LAYER_IDS, H, DT, lengths[b])
        out.append(
            to_encoded_sample(
                rows,
                storage=storage,
                spec=spec,
                sent_token_ids=r.token_ids,
                loss_mask=r.loss_mask,
                finite_on_device=True,
            )
        )
    return out


# ------------------------------------------------------------------ encode where the states are


@pytest.mark.parametrize("storage", ENCODED_STORAGES, ids=str)
def test_a_batch_encoded_at_once_gives_each_sample_its_own_encoding_bit_for_bit(storage):
    records = list(wide_range_samples().values())
    for r, device in zip(records, batch_as_the_device_encodes_it(records, storage)):
        alone = storage.encode(r.states())
        assert device.encoded is not None and sorted(device.encoded) == sorted(alone)
        for name, t in alone.items():
            assert device.encoded[name].dtype == t.dtype
            assert torch.equal(device.encoded[name].view(torch.uint8), t.view(torch.uint8)), name


def test_the_scale_is_a_true_division_not_a_product_with_the_reciprocal():
    """CUDA divides by a Python number as a product with its reciprocal; 1/448 is inexact, so the
    scale would differ from a CPU's in some last bits. The encode divides as the CPU does: its
    scale is the correctly rounded quotient (float64 then float32 rounds a quotient correctly)."""
    g = torch.Generator().manual_seed(0)
    amax = torch.rand(20_000, generator=g) * 1000
    by_reciprocal = amax * (1 / FP8_MAX)
    differs = amax[(amax / FP8_MAX) != by_reciprocal]
    assert differs.numel() > 0  # the two are not the same computation
    h = torch.zeros(differs.numel(), 2, 4)  # [T, 2 layers, H]: the aux row's amax is the value
    h[:, 0, 0] = differs
    scale = FP8.encode(h)["hidden_aux_scale"][:, 0]
    want = (differs.double() / FP8_MAX).float().clamp_min(1e-30).to(torch.bfloat16)
    assert torch.equal(scale, want)


@pytest.mark.parametrize("storage", ENCODED_STORAGES, ids=str)
def test_pre_encoded_samples_through_the_real_writer_make_the_same_shard_files(tmp_path, storage):
    records = wide_range_samples()
    device = dict(zip(records, batch_as_the_device_encodes_it(list(records.values()), storage)))
    cpu = write_in_storage(tmp_path / "cpu", records, storage)
    dev = write_in_storage(tmp_path / "dev", device, storage, background=True)
    assert [s.file for s in cpu.shards] == [s.file for s in dev.shards] and len(cpu.shards) > 2
    for a, b in zip(cpu.shards, dev.shards):
        assert a == b  # size, sha256, counts
        assert sha256_of(tmp_path / "cpu" / a.file) == sha256_of(tmp_path / "dev" / b.file) == a.sha256
    ds = HiddenStateDataset(tmp_path / "dev", verify="full")
    assert ds.storage == storage and len(ds) == len(records)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("storage", ENCODED_STORAGES, ids=str)
def test_the_writer_threads_encoding_on_the_gpu_write_the_host_encodes_shard_files(tmp_path, storage):
    """vLLM's capture hands its states over on the host; a GPU topology's writer threads encode
    them on the GPU (encode_device): the same files, byte for byte, as the host's encode."""
    records = wide_range_samples()
    cpu = write_in_storage(tmp_path / "cpu", records, storage)
    gpu = write_in_storage(tmp_path / "gpu", records, storage, background=True, encode_device="cuda")
    assert len(cpu.shards) > 2 and cpu.shards == gpu.shards
    for a in cpu.shards:
        assert sha256_of(tmp_path / "cpu" / a.file) == sha256_of(tmp_path / "gpu" / a.file) == a.sha256


def test_the_writer_refuses_an_encoded_sample_of_another_format_by_name(tmp_path):
    records = list(wide_range_samples(2).values())
    int4 = batch_as_the_device_encodes_it(records, INT4)[0]
    w = ShardWriter(tmp_path, layer_ids=LAYER_IDS, hidden_size=H, dtype=DT, fingerprint_inputs=INPUTS, storage=FP8)
    with pytest.raises(StoreError, match="sample 'a' storage: expected fp8, got int4"):
        w.add("a", int4)
    fp8 = batch_as_the_device_encodes_it(records, FP8)[0]
    assert fp8.encoded is not None
    fp8.encoded["hidden_final"] = fp8.encoded["hidden_final"].float()
    with pytest.raises(StoreError, match=r"sample 'b' encoded hidden_final: expected torch.bfloat16 \[4, 1, 64\]"):
        w.add("b", fp8)
    w.close()
    with pytest.raises(CaptureError, match="NaN/Inf in torch.bfloat16 on the device"):
        to_encoded_sample(
            dict(fp8.encoded),
            storage=FP8,
            spec=CaptureSpec(LAYER_IDS, H, DT, 4),
            sent_token_ids=fp8.token_ids,
            loss_mask=fp8.loss_mask,
            finite_on_device=False,
            sample_id="s0",
        )
    with pytest.raises(CaptureError, match="DeviceEncoding.storage: expected a format other than exact"):
        DeviceEncoding(StorageFormat(), StorageFormat().encode)
    with pytest.raises(
        CaptureError, match="CapturedSample.hidden: expected the states as captured, got only their fp8"
    ):
        fp8.states()


# ------------------------------------------------------------------ decode where the training runs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_devices_float_path_decodes_the_bits_the_cpu_bits_path_decodes(dtype):
    h = wide_range_states(40, dtype=dtype)
    h[3, 0] = 0  # an all-zero row
    h[5, 1, :8] = torch.tensor([1e-3, -2e-3, 3e-4, 0, 5, -448, 448, 1], dtype=dtype)  # subnormal codes
    enc = FP8.encode(h)
    cpu = FP8.decode(enc, dtype)  # bf16: the bits path
    meta = {k: v.to("meta") for k, v in enc.items()}
    assert FP8.decode(meta, dtype).device.type == "meta"  # off the CPU: no host read of the scales
    aux = torch.empty(40, 2, H, dtype=dtype)
    aux.copy_(enc["hidden_aux"].to(torch.float32).mul_(enc["hidden_aux_scale"].float().unsqueeze(-1)))
    assert torch.equal(cpu[:, :2], aux) and torch.equal(cpu[:, 2], h[:, 2])
    assert torch.equal(FP8.decode(enc, dtype, float_path=True), cpu)
    split_aux, split_final = FP8.decode_split(enc, dtype)
    assert torch.equal(split_aux, cpu[:, :2]) and torch.equal(split_final, cpu[:, 2])


def test_every_e4m3_code_decodes_alike_on_both_paths_but_nan_which_only_the_float_path_keeps():
    codes = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(torch.float8_e4m3fn)  # [256]
    rows = {
        "hidden_aux": codes.reshape(8, 1, 32),  # [T, 1 aux layer, H]
        "hidden_aux_scale": torch.tensor([0.5, 1, 2, 3e-3, 7, 100, 1e-30, 127], dtype=DT).reshape(8, 1),
        "hidden_final": torch.zeros(8, 1, 32, dtype=DT),
    }
    bits, floats = FP8.decode(rows, DT)[:, 0], FP8.decode(rows, DT, float_path=True)[:, 0]  # [8, 32]
    nan = torch.isnan(floats)
    assert nan.sum() == 2 and not torch.isnan(bits).any()  # 0x7F and 0xFF: a number on the bits path
    assert torch.equal(bits[~nan], floats[~nan])
    product = (codes.float().reshape(8, 32) * rows["hidden_aux_scale"].float()).to(DT)  # rounded once
    assert torch.equal(floats[~nan], product[~nan])
    assert not FP8.decodes_finite(rows, DT)


@pytest.mark.parametrize("storage", ENCODED_STORAGES, ids=str)
@pytest.mark.parametrize("row_tokens", [None, 32])
def test_a_batch_decoded_after_the_copy_equals_the_batch_of_decoded_samples(storage, row_tokens):
    items = [
        {"input_ids": r.token_ids, "loss_mask": r.loss_mask, "hidden": r.states()}
        for r in wide_range_samples().values()
    ]
    enc = [{"input_ids": i["input_ids"], "loss_mask": i["loss_mask"], **storage.encode(i["hidden"])} for i in items]
    dec = [{**i, "hidden": storage.decode(storage.encode(i["hidden"]), DT)} for i in items]
    for fixed in (False, True):
        want = collate_rows(dec, 64, row_tokens, fixed)
        travelled = collate_rows(enc, 64, row_tokens, fixed, split=False)
        assert "hidden" not in travelled and travelled["hidden_aux"].shape[:2] == want["input_ids"].shape
        got = decode_hidden(travelled, storage, DT)
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            assert v.dtype == got[k].dtype and torch.equal(v, got[k]), k
    # an exact batch is split as before
    exact = collate_rows(items, 64, None, split=False)
    assert all(
        torch.equal(a, b)
        for a, b in zip(decode_hidden(exact, StorageFormat(), DT).values(), split_hidden(exact).values())
    )


@pytest.mark.parametrize("workers", [0, 1])
def test_the_data_module_decoding_after_the_transfer_gives_the_workers_batches(tmp_path, workers):
    write_in_storage(tmp_path / "ds", wide_range_samples(), FP8)
    kw = dict(shape=BatchShape(96, row_tokens=48), num_workers=workers)
    on_device = Eagle3DataModule(str(tmp_path / "ds"), decode_on_device=True, **kw)
    in_workers = Eagle3DataModule(str(tmp_path / "ds"), decode_on_device=False, **kw)
    got_batches = list(on_device.train_dataloader())
    assert got_batches and all(b["hidden_aux"].dtype == torch.float8_e4m3fn for b in got_batches)
    pairs = list(zip(got_batches, in_workers.train_dataloader(), strict=True))
    for travelled, decoded in pairs:
        got = on_device.on_after_batch_transfer(travelled, 0)
        want = in_workers.on_after_batch_transfer(decoded, 0)
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            assert torch.equal(v, got[k]), k


def test_a_damaged_encoded_sample_is_refused_without_decoding_the_good_ones(tmp_path):
    records = wide_range_samples(3)
    write_in_storage(tmp_path / "ds", records, FP8)
    ds = HiddenStateDataset(tmp_path / "ds").encoded_rows()
    row = ds[0]
    assert "hidden" not in row and FP8.decodes_finite({k: row[k] for k in row if k.startswith("hidden")}, DT)
    assert FP8.decode({k: row[k] for k in row if k.startswith("hidden")}, DT).shape == (
        row["input_ids"].shape[0],
        3,
        H,
    )
    bad = {k: v.clone() for k, v in row.items()}
    bad["hidden_aux"].view(torch.uint8)[2, 1, 5] = 0x7F  # e4m3fn's NaN
    assert not FP8.decodes_finite({k: bad[k] for k in ("hidden_aux", "hidden_aux_scale", "hidden_final")}, DT)
    big = {k: v.clone() for k, v in row.items() if k.startswith("hidden")}
    big["hidden_aux_scale"][0, 0] = 1e3  # x 448 overflows float16 (not bf16): a possible Inf, decoded to know
    assert not FP8.decodes_finite(big, torch.float16) and FP8.decodes_finite(big, DT)
    # on disk: a scale turned Inf is refused by the reader, naming the shard, sample and layer
    shard = tmp_path / "ds" / ds.manifest.shards[0].file
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(shard), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    first = HiddenStateDataset(tmp_path / "ds").sample_id(0)
    for damage in ("scale", "code"):
        damaged = {k: v.clone() for k, v in tensors.items()}
        if damage == "scale":
            damaged["hidden_aux_scale"][1, 1] = float("inf")
        else:
            damaged["hidden_aux"].view(torch.uint8)[1, 1, 3] = 0xFF  # e4m3fn's NaN (a number on the bits path)
        save_file(damaged, str(shard), metadata=meta)
        for view in (HiddenStateDataset(tmp_path / "ds"), HiddenStateDataset(tmp_path / "ds").encoded_rows()):
            match = rf"sample '{first}': hidden: expected finite values.*at token 1, layer id 2"
            with pytest.raises(DamagedDatasetError, match=match):
                view[0]
            assert view[1]["input_ids"].numel() > 0  # the other samples still read


def _fit(dataset_dir: Path, decode_on_device: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The real data module, LightningModule and trainer: 4 steps on this CPU; the head's weights
    before and after."""

    from eagle3.config.choices import AttentionKind
    from eagle3.config.training import TrainConfig
    from eagle3.draft.config import DraftConfig
    from eagle3.draft.head import Eagle3DraftHead
    from eagle3.training.module import Eagle3LitModule

    torch.manual_seed(0)
    hf = dict(
        hidden_size=H,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * H,
        vocab_size=VOCAB,
        max_position_embeddings=512,
    )
    head = Eagle3DraftHead(DraftConfig.from_target_config(hf, 16, num_aux_layers=2), attention="sdpa")
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[:16] = True
    w = torch.randn(VOCAB, H) * 0.02
    head.load_target_weights(w, torch.ones(H), w, torch.zeros(16, dtype=torch.int64), t2d, True)
    cfg = TrainConfig(ttt_steps=2, compile=False, attention=AttentionKind.sdpa, lr=1e-3, max_steps=4, warmup_steps=1)
    before = {k: v.detach().clone() for k, v in head.state_dict().items()}
    dm = Eagle3DataModule(str(dataset_dir), shape=BatchShape(48), decode_on_device=decode_on_device)
    trainer = quiet_cpu_trainer(
        max_steps=4,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(Eagle3LitModule(head, cfg, replay_draft_tokens=0), datamodule=dm)
    assert trainer.global_step == 4
    return before, {k: v.detach().clone() for k, v in head.state_dict().items()}


def test_training_on_batches_decoded_after_the_transfer_steps_to_the_same_weights(tmp_path):
    """The LightningModule's steps on batches that crossed encoded and were decoded in
    on_after_batch_transfer (the GPU route, run on this CPU) end at the weights of the steps on
    batches the loader decoded, bit for bit."""
    write_in_storage(tmp_path / "ds", wide_range_samples(), FP8)
    (before, after_transfer), (_, in_loader) = _fit(tmp_path / "ds", True), _fit(tmp_path / "ds", False)
    assert sorted(after_transfer) == sorted(in_loader)
    for k, v in in_loader.items():
        assert torch.equal(after_transfer[k], v), k
    assert not torch.equal(before["fc.weight"], in_loader["fc.weight"])  # the steps moved the weights
