"""SmolLM2 computes in the stored dtype where the CPU runs bf16 natively and in fp32 where it
emulates it: the dataset, the capture, the online target and the regeneration, run for real."""

from __future__ import annotations

import pytest
import torch
from conftest import compose
from helpers import SHORT_CHATS, chat_samples
from helpers.cpu import EMULATED_BF16_FLAGS, NATIVE_BF16_FLAGS, fake_bf16_cpu

from eagle3.target_model import compute_dtype as cd
from eagle3.target_model.capture_hf import HFCaptureBackend

CAPTURE_IDS = [2, 15, 27, 30]


def test_the_dataset_does_not_depend_on_the_cpu(monkeypatch, smollm2_dir):
    """Same stored dtype, same dataset: the fingerprint never sees the compute dtype."""
    from eagle3.extraction.identity import dataset_path
    from eagle3.stages.narrow import dataset_identity

    cfg = compose("extract", [])
    names = set()
    for flags in (NATIVE_BF16_FLAGS, EMULATED_BF16_FLAGS):
        monkeypatch.setattr(cd, "cpu_flags", lambda flags=flags: flags)
        monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)
        names.add(dataset_path(dataset_identity(cfg, str(smollm2_dir))).name)
    assert len(names) == 1


def _capture(target_dir) -> tuple[HFCaptureBackend, list]:
    backend = HFCaptureBackend(target_dir, CAPTURE_IDS, dtype=torch.bfloat16, batch_size=4)
    return backend, list(backend.capture(chat_samples(target_dir, SHORT_CHATS)))


def test_capture_stores_bf16_from_either_forward(monkeypatch, smollm2_dir):
    records = {}
    for name, flags in (("native", NATIVE_BF16_FLAGS), ("emulated", EMULATED_BF16_FLAGS)):
        monkeypatch.setattr(cd, "cpu_flags", lambda flags=flags: flags)
        monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)
        backend, records[name] = _capture(smollm2_dir)
        weights = next(backend.model.parameters()).dtype
        assert (backend.compute_dtype, weights) == ((torch.bfloat16,) * 2 if name == "native" else (torch.float32,) * 2)
        backend.close()
    assert len(records["native"]) == len(records["emulated"]) == len(SHORT_CHATS)
    for a, b in zip(records["native"], records["emulated"]):
        assert a.hidden.dtype == b.hidden.dtype == torch.bfloat16  # the stored layout, unchanged
        assert a.hidden.shape == b.hidden.shape and torch.equal(a.token_ids, b.token_ids)
        # an fp32 forward rounded once against a bf16 forward rounded at every layer: close,
        # not equal (a wrong layer or a missed cast would be far off or refused by the adapter)
        x, y = a.hidden.float(), b.hidden.float()
        assert ((x - y).norm() / y.norm()).item() < 3e-2


@pytest.mark.parametrize("cpu", ["native", "emulated"])  # bf16 matmuls faked present or absent
def test_the_online_target_computes_in_fp32_where_bf16_is_emulated(cpu, monkeypatch, smollm2_dir):
    fake_bf16_cpu(monkeypatch, cpu)
    from eagle3.training.online import OnlineHiddenStates

    target = OnlineHiddenStates(
        str(smollm2_dir), CAPTURE_IDS, 576, torch.bfloat16, max_tokens_per_batch=256, row_tokens=None, fixed_shape=False
    )
    target.setup("cpu")
    try:
        assert target.backend is not None
        assert target.backend.compute_dtype == (torch.bfloat16 if cpu == "native" else torch.float32)
        items = [{"sample_id": s, "input_ids": i, "loss_mask": m} for s, i, m in chat_samples(smollm2_dir, SHORT_CHATS)]
        batch = target(items)
        assert batch["aux_hidden"].dtype == batch["final_hidden"].dtype == torch.bfloat16
    finally:
        target.close()


@pytest.mark.parametrize("cpu", ["native", "emulated"])  # bf16 matmuls faked present or absent
def test_regeneration_loads_the_target_in_the_compute_dtype(cpu, monkeypatch, smollm2_dir, tmp_path):
    fake_bf16_cpu(monkeypatch, cpu)
    from eagle3.target_model.generate.common import AnswerSettings
    from eagle3.target_model.generate.hf_engine import HFRegenerator

    regen = HFRegenerator(
        smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=4, max_model_len=64), dtype="bfloat16"
    )
    try:
        assert regen._load().dtype == (torch.bfloat16 if cpu == "native" else torch.float32)
    finally:
        regen.close()
