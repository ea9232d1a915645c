"""The dtype a target forward computes in, given the dtype its hidden states are stored in.

The stored dtype (capture.dtype, bf16 by default) is the dataset's format and is in its
fingerprint; the compute dtype is only how this machine gets there. CUDA, and an x86 CPU with
half-precision dot products (avx512_bf16 or AMX tiles for bf16; avx512_fp16 or AMX-FP16 for
fp16), run half-precision matmuls natively, unless oneDNN is capped below those instructions
(ONEDNN_MAX_CPU_ISA). Any other CPU emulates them: SmolLM2-135M's capture forward in bf16 ran
several times slower than in fp32 with oneDNN and ATen capped to AVX2, and several times faster
uncapped on the same Xeon with AMX (bench/cpu_capture_dtype.py; docs/records/2026-12-01-make-demo.md).
Where bf16 is emulated the forward runs in fp32 and its hidden states are cast to the stored
dtype before they reach the adapter: the same layout, the same dataset identity, values within
one bf16 rounding of a native bf16 forward.
"""

from __future__ import annotations

import os
from functools import cache

import torch

# /proc/cpuinfo flags under which oneDNN runs each half dtype's matmuls natively
_NATIVE_FLAGS = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}


@cache
def onednn_allows_bf16() -> bool:
    """Whether oneDNN will use the CPU's bf16 instructions (False when ONEDNN_MAX_CPU_ISA caps
    it below them); True where torch does not say."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return True


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux); empty where /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:  # not Linux: no reliable check, so nothing counts as native
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def cpu_runs_natively(dtype: torch.dtype) -> bool:
    """Whether this CPU runs ``dtype`` matmuls without emulation (fp32 always does)."""
    flags = _NATIVE_FLAGS.get(dtype)
    if flags is None:
        return True
    if dtype == torch.bfloat16 and not onednn_allows_bf16():
        return False
    return any(flag in cpu_flags() for flag in flags)


def cpu_bf16_on_amx() -> bool:
    """bf16 matmuls run on AMX tiles here: the fastest CPU rate, and results that depend on the
    batch's shape (the tiling follows it)."""
    return cpu_has_native_bf16() and "amx_bf16" in cpu_flags()


def cpu_has_native_bf16() -> bool:
    """An x86 CPU with bf16 dot products (avx512_bf16, or AMX tiles): oneDNN then runs bf16
    matmuls natively. Elsewhere bf16 is emulated and slower than fp32."""
    return cpu_runs_natively(torch.bfloat16)


def compute_dtype(stored: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype a target forward on ``device`` computes in to produce ``stored`` hidden states:
    ``stored`` itself, except a half dtype on a CPU that would emulate it (then fp32)."""
    if torch.device(device).type != "cpu" or cpu_runs_natively(stored):
        return stored
    return torch.float32


def compute_note(stored: torch.dtype, compute: torch.dtype) -> str | None:
    """One line for the log when the compute dtype differs from the stored one, else None."""
    if compute == stored:
        return None
    name, flags = str(stored).removeprefix("torch."), " / ".join(_NATIVE_FLAGS.get(stored, ()))
    why = f"no {flags} in /proc/cpuinfo"
    has_flags = any(flag in cpu_flags() for flag in _NATIVE_FLAGS.get(stored, ()))
    # torch's bf16 check is False on a CPU without the instructions too: a cap only where they exist
    if stored == torch.bfloat16 and has_flags and not onednn_allows_bf16():
        why = (
            f"oneDNN is capped below its bf16 instructions (ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')})"
        )
    return (
        f"this CPU would emulate {name} matmuls ({why}): the target runs in "
        f"{str(compute).removeprefix('torch.')} in place of {name}"
    )
