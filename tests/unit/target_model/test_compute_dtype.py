"""A target forward computes in the stored dtype where the hardware runs it natively, and in
fp32 on a CPU that would emulate bf16 (no avx512_bf16 / AMX): capture, the online target and
regeneration by transformers all follow the one check, while what is stored stays the
configured dtype, so the dataset is the same. The CPU's capability is faked both ways.
The check itself here; the real SmolLM2 through each path: integration/test_compute_dtype_smollm2.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import compose
from helpers.cpu import EMULATED_BF16_FLAGS, NATIVE_BF16_FLAGS, fake_bf16_cpu

from eagle3.target_model import compute_dtype as cd


@pytest.fixture(params=["native", "emulated"])
def cpu(request, monkeypatch) -> str:
    """This CPU with bf16 matmuls faked present ("native") or absent ("emulated")."""
    fake_bf16_cpu(monkeypatch, request.param)
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
    monkeypatch.setattr(cd, "cpu_flags", lambda: NATIVE_BF16_FLAGS)
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: False)
    assert cd.compute_dtype(torch.bfloat16, "cpu") == torch.float32
    assert "oneDNN is capped below its bf16 instructions" in cd.compute_note(torch.bfloat16, torch.float32)


def test_a_cpu_without_the_instructions_is_not_called_capped(monkeypatch):
    """torch's bf16 check also says False where the CPU lacks the instructions: the note names them."""
    monkeypatch.setattr(cd, "cpu_flags", lambda: EMULATED_BF16_FLAGS)
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
