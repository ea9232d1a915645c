"""The CUDA batch path of the data module: pinned batches copied on a side stream
(Eagle3DataModule.transfer_batch_to_device). Runs on a GPU machine:

    python -m pytest tests/unit/training/test_gpu_batches.py
"""

from __future__ import annotations

import traceback
import warnings

import lightning as L
import pytest
import torch

from eagle3.store import ShardWriter
from eagle3.store.batch_options import BatchShape
from eagle3.store.storage_format import StorageFormat
from eagle3.target_model.adapter import CapturedSample
from eagle3.training.datamodule import Eagle3DataModule

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the side-stream copy is CUDA only")

LAYER_IDS, H, VOCAB = (1, 2, 3, 4), 512, 1000


def _dataset(path, n: int = 24, storage: str = "exact"):
    w = ShardWriter(
        path,
        layer_ids=LAYER_IDS,
        hidden_size=H,
        dtype=torch.bfloat16,
        fingerprint_inputs={"test": "gpu_batches"},
        storage=StorageFormat(storage),
    )
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        t = int(torch.randint(100, 500, (1,), generator=g))
        w.add(
            f"s{i:02d}",
            CapturedSample(
                token_ids=torch.randint(0, VOCAB, (t,), generator=g),
                loss_mask=torch.rand(t, generator=g) > 0.3,
                hidden=torch.randn(t, len(LAYER_IDS), H, generator=g).to(torch.bfloat16),
            ),
        )
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[:64] = True
    w.finish(torch.arange(VOCAB), {64: (torch.zeros(64, dtype=torch.int64), t2d)}, val_ids=["s00", "s01"])


def test_side_stream_batches_equal_the_host_batches_while_the_gpu_is_busy(tmp_path):
    """The copy runs on a side stream while the step stream is still busy; a kernel the step
    stream queues right after must read the whole batch (wait_stream), never a copy in flight.
    A chain of matmuls queued before each copy keeps the step stream busy, so a missing wait
    shows as a mismatch."""
    _dataset(tmp_path / "ds")
    dm = Eagle3DataModule(str(tmp_path / "ds"), shape=BatchShape(1024, fixed_shape=True), pin_memory=True)
    device = torch.device("cuda")
    busy = torch.randn(4096, 4096, device=device)
    checked = 0
    for host in dm.train_dataloader():  # pinned; hidden [B, T, L, H] whole (split on the device)
        assert host["hidden"].is_pinned()
        for _ in range(30):
            busy = torch.tanh(busy @ busy)  # ~ms of work on the step stream ahead of the copy
        moved = dm.transfer_batch_to_device(host, device, 0)
        read = {k: v.clone() for k, v in moved.items() if isinstance(v, torch.Tensor) and v.is_cuda}
        assert "hidden" in read and "num_tokens" not in read  # tokens are counted on the host
        for k, v in read.items():
            assert torch.equal(v.cpu(), host[k]), k
        split = dm.on_after_batch_transfer(moved, 0)
        assert split["aux_hidden"].shape[-1] == 3 * H and split["final_hidden"].shape[-1] == H
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("storage", ["fp8", "int4"])
def test_an_encoded_batch_decoded_on_the_gpu_equals_the_workers_decode(tmp_path, storage):
    """capture.storage fp8/int4: the batch crosses as the format's tensors (pinned, on the side
    stream) and is decoded on the GPU; every tensor equals the batch a loader worker decoded."""
    _dataset(tmp_path / "ds", storage=storage)
    kw = dict(shape=BatchShape(1024, fixed_shape=True), pin_memory=True)
    on_gpu = Eagle3DataModule(str(tmp_path / "ds"), decode_on_device=True, **kw)
    on_host = Eagle3DataModule(str(tmp_path / "ds"), decode_on_device=False, **kw)
    device = torch.device("cuda")
    checked = 0
    for travelled, decoded in zip(on_gpu.train_dataloader(), on_host.train_dataloader(), strict=True):
        assert "hidden" not in travelled and travelled["hidden_aux"].is_pinned()
        got = on_gpu.on_after_batch_transfer(on_gpu.transfer_batch_to_device(travelled, device, 0), 0)
        want = on_host.on_after_batch_transfer(decoded, 0)
        assert sorted(got) == sorted(want) and got["aux_hidden"].is_cuda
        for k, v in want.items():
            assert torch.equal(got[k].cpu(), v), k
        checked += 1
    assert checked >= 4


class _WaitsAfter(L.Callback):
    """From step ``start`` on, records every call that makes the host wait for the GPU (torch's
    sync debug mode), with the stack that made it."""

    def __init__(self, start: int):
        self.start, self.waits = start, []
        self._show = warnings.showwarning

    def _record(self, message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing CUDA operation" in str(message):
            self.waits.append("".join(traceback.format_stack()[-12:-1]))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.start:
            warnings.showwarning = self._record
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")

    def on_train_end(self, trainer, pl_module):
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._show


@pytest.mark.parametrize("storage", ["exact", "fp8"])
def test_training_steps_never_make_the_host_wait_for_the_gpu(tmp_path, storage):
    """A host that waits for step N cannot queue step N+1 while the GPU runs N: the GPU idles
    between steps. The real module, data module and callbacks (throughput, progress bar)
    train 10 steps on CUDA; after the first two, no call may block on the device."""
    from eagle3.config.choices import AttentionKind
    from eagle3.config.training import TrainConfig
    from eagle3.draft.config import DraftConfig
    from eagle3.draft.head import Eagle3DraftHead
    from eagle3.training.callbacks import SparseProgressBar, TokenThroughput
    from eagle3.training.module import Eagle3LitModule

    _dataset(tmp_path / "ds", storage=storage)  # fp8: the batch decoded on the GPU, with no wait either
    dm = Eagle3DataModule(str(tmp_path / "ds"), shape=BatchShape(1024, fixed_shape=True), pin_memory=True)
    hf = dict(
        hidden_size=H,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * H,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
    )
    head = Eagle3DraftHead(DraftConfig.from_target_config(hf, draft_vocab_size=64), attention="sdpa")
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[:64] = True
    w = torch.randn(VOCAB, H) * 0.02
    head.load_target_weights(w, torch.ones(H), w, torch.zeros(64, dtype=torch.int64), t2d, True)
    cfg = TrainConfig(ttt_steps=2, compile=False, attention=AttentionKind.sdpa, lr=1e-3, max_steps=10, warmup_steps=2)
    waits = _WaitsAfter(start=2)
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        precision="bf16-mixed",
        max_steps=10,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        gradient_clip_val=1.0,
        callbacks=[TokenThroughput(), SparseProgressBar(every=1000), waits],
        use_distributed_sampler=False,
    )
    trainer.fit(Eagle3LitModule(head, cfg, replay_draft_tokens=0), datamodule=dm)
    assert trainer.global_step == 10
    assert not waits.waits, f"{len(waits.waits)} waits for the GPU; the first:\n{waits.waits[0]}"
    assert float(trainer.callback_metrics["train/tokens_per_s"]) > 0
