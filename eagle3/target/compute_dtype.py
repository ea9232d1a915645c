"""The dtype a target forward computes in, given the dtype its hidden states are stored in.

The stored dtype (capture.dtype, bf16 by default) is the dataset's format and is in its
fingerprint; the compute dtype is only how this machine gets there. CUDA, and an x86 CPU with
half-precision dot products (avx512_bf16 or AMX tiles for bf16; avx512_fp16 or AMX-FP16 for
fp16), run half-precision matmuls natively. Any other CPU emulates them: on this project's
2-core CPU with oneDNN and ATen capped to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2), SmolLM2-135M's capture forward ran 133 tok/s in bf16 against
1,118 tok/s in fp32 (docs/results.md, section 1). There the forward runs in fp32 and its hidden
states are cast to the stored dtype before they reach the adapter: the same layout, the same
dataset identity, values within one bf16 rounding of a native bf16 forward.
"""

from __future__ import annotations

from functools import cache

import torch

# /proc/cpuinfo flags under which oneDNN runs each half dtype's matmuls natively
_NATIVE_FLAGS = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}


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
    return flags is None or any(flag in cpu_flags() for flag in flags)


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
    return (
        f"this CPU has no native {name} matmuls (no {flags} in /proc/cpuinfo): the target runs in "
        f"{str(compute).removeprefix('torch.')} in place of {name}"
    )
