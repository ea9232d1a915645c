"""A target forward computes in the stored dtype where the hardware runs it natively, and in
fp32 on a CPU that would emulate bf16 (no avx512_bf16 / AMX): capture, the online target and
regeneration by transformers all follow the one check, while what is stored stays the
configured dtype, so the dataset is the same. The CPU's capability is faked both ways.

Real SmolLM2-135M (tokenizer + weights).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import compose
from helpers import SHORT_CHATS, chat_samples

from eagle3.target_model import compute_dtype as cd
from eagle3.target_model.capture_hf import HFCaptureBackend

NATIVE = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
EMULATED = frozenset({"avx2", "fma"})  # e.g. an AMD EPYC before Zen 4
CAPTURE_IDS = [2, 15, 27, 30]


@pytest.fixture(params=["native", "emulated"])
def cpu(request, monkeypatch) -> str:
    """This CPU with bf16 matmuls faked present ("native") or absent ("emulated")."""
    monkeypatch.setattr(cd, "cpu_flags", lambda: NATIVE if request.param == "native" else EMULATED)
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)  # whatever CI's CPU is
    return request.param


def test_the_compute_dtype_follows_the_cpu(cpu):
    want = torch.bfloat16 if cpu == "native" else torch.float32
    assert cd.cpu_has_native_bf16() is (cpu == "native")
    assert cd.compute_dtype(torch.bfloat16, "cpu") == want
    assert cd.compute_dtype(torch.float32, "cpu") == torch.float32  # fp32 is never emulated
    assert cd.compute_dtype(torch.float16, "cpu") == torch.float32  # neither set has avx512_fp16
    assert cd.compute_dtype(torch.bfloat16, "cuda") == torch.bfloat16  # a GPU is not the CPU
    note = cd.compute_note(torch.bfloat16, cd.compute_dtype(torch.bfloat16, "cpu"))
    assert (note is None) is (cpu == "native")
    if note:
        assert "would emulate bfloat16 matmuls (no avx512_bf16" in note and "runs in float32" in note


def test_amx_alone_counts_as_native(monkeypatch):
    monkeypatch.setattr(cd, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)
    assert cd.compute_dtype(torch.bfloat16, torch.device("cpu")) == torch.bfloat16


def test_onednn_capped_below_bf16_counts_as_emulated(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 on a CPU whose flags list avx512_bf16: oneDNN emulates bf16."""
    monkeypatch.setattr(cd, "cpu_flags", lambda: NATIVE)
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: False)
    assert cd.compute_dtype(torch.bfloat16, "cpu") == torch.float32
    assert "oneDNN is capped below its bf16 instructions" in cd.compute_note(torch.bfloat16, torch.float32)


def test_a_cpu_without_the_instructions_is_not_called_capped(monkeypatch):
    """torch's bf16 check also says False where the CPU lacks the instructions: the note names them."""
    monkeypatch.setattr(cd, "cpu_flags", lambda: EMULATED)
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: False)
    note = cd.compute_note(torch.bfloat16, cd.compute_dtype(torch.bfloat16, "cpu"))
    assert "no avx512_bf16 / amx_bf16 in /proc/cpuinfo" in note and "capped" not in note


def test_the_real_onednn_check_reads_the_isa_cap():
    """In a fresh process, oneDNN capped to AVX2 refuses bf16 whatever the CPU."""
    code = "from eagle3.target_model.compute_dtype import onednn_allows_bf16 as f; print(f())"
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_training_precision_follows_the_same_check(cpu):
    from eagle3.training.step_path import resolve_precision

    cfg = compose("train", ["topology=cpu"])
    assert resolve_precision(cfg.topology) == ("bf16-mixed" if cpu == "native" else "32-true")


def test_the_dataset_does_not_depend_on_the_cpu(monkeypatch, smollm2_dir):
    """Same stored dtype, same dataset: the fingerprint never sees the compute dtype."""
    from eagle3.extraction.identity import dataset_path
    from eagle3.stages.narrow import dataset_identity

    cfg = compose("extract", [])
    names = set()
    for flags in (NATIVE, EMULATED):
        monkeypatch.setattr(cd, "cpu_flags", lambda flags=flags: flags)
        monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)
        names.add(dataset_path(dataset_identity(cfg, str(smollm2_dir))).name)
    assert len(names) == 1


def _capture(model_dir) -> tuple[HFCaptureBackend, list]:
    backend = HFCaptureBackend(model_dir, CAPTURE_IDS, dtype=torch.bfloat16, batch_size=4)
    return backend, list(backend.capture(chat_samples(model_dir, SHORT_CHATS)))


def test_capture_stores_bf16_from_either_forward(monkeypatch, smollm2_dir):
    records = {}
    for name, flags in (("native", NATIVE), ("emulated", EMULATED)):
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


def test_the_online_target_computes_in_fp32_where_bf16_is_emulated(cpu, smollm2_dir):
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


def test_regeneration_loads_the_target_in_the_compute_dtype(cpu, smollm2_dir, tmp_path):
    from eagle3.target_model.generate.hf_engine import HFRegenerator

    regen = HFRegenerator(smollm2_dir, tmp_path, max_tokens=4, max_model_len=64, dtype="bfloat16")
    try:
        assert regen._load().dtype == (torch.bfloat16 if cpu == "native" else torch.float32)
    finally:
        regen.close()
