"""A CPU with bf16 matmuls faked present or absent: what eagle3.target_model.compute_dtype reads."""

from __future__ import annotations

from eagle3.target_model import compute_dtype

NATIVE_BF16_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
EMULATED_BF16_FLAGS = frozenset({"avx2", "fma"})  # e.g. an AMD EPYC before Zen 4


def fake_bf16_cpu(monkeypatch, kind: str) -> None:
    """This CPU with bf16 matmuls faked present (``kind`` "native") or absent ("emulated")."""
    flags = NATIVE_BF16_FLAGS if kind == "native" else EMULATED_BF16_FLAGS
    monkeypatch.setattr(compute_dtype, "cpu_flags", lambda: flags)
    monkeypatch.setattr(compute_dtype, "onednn_allows_bf16", lambda: True)  # whatever CI's CPU is
