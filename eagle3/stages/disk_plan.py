"""What an extraction will store, computed from config alone, so `--cfg job --resolve`
shows it before a GPU is booked:

    python extract.py model=kimi_k2_5 topology=gpu8_tp8 capture=vllm --cfg job --resolve
      capture.hidden_layout:      bfloat16 [T, 4, 7168]    (aux ids [2, 30, 58] + final 61)
      capture.disk_per_1m_tokens: 53.4 GiB

The dtype is the capture dtype (the target's compute dtype), never its weight format: an
INT4 checkpoint computes, and so stores, bf16 hidden states. The disk figure is the one
extract.py checks against free space before it starts (eagle3.store.disk).
"""

from __future__ import annotations

from collections.abc import Sequence

from eagle3.util import hidden_dtypes

MILLION = 1_000_000


def _check_dtype(dtype: str) -> str:
    return hidden_dtypes.check_name(
        dtype,
        hint="the hidden-state dtype, i.e. what the target computes in; "
        "a quantized weight format belongs in model.quantization",
    )


def hidden_layout(dtype: str, layer_ids: Sequence[int], hidden_size: int) -> str:
    """The stored hidden tensor per sample, e.g. ``bfloat16 [T, 4, 7168]``."""
    return f"{_check_dtype(dtype)} [T, {len(layer_ids)}, {int(hidden_size)}]"


def disk_bytes(
    num_tokens: int, layer_ids: Sequence[int], hidden_size: int, dtype: str, shard_max_tokens: int = 65536
) -> int:
    from eagle3.store.disk import disk_needed_bytes  # only when resolved: composing a config stays light

    return disk_needed_bytes(
        int(num_tokens),
        len(layer_ids),
        int(hidden_size),
        hidden_dtypes.torch_dtype(_check_dtype(dtype)),
        0,
        int(shard_max_tokens),
    )


def disk_per_million_tokens(
    layer_ids: Sequence[int], hidden_size: int, dtype: str, shard_max_tokens: int = 65536
) -> str:
    from eagle3.store.disk import format_bytes

    return format_bytes(disk_bytes(MILLION, layer_ids, hidden_size, dtype, shard_max_tokens))


def vllm_capture_route(accelerator: str) -> str:
    """capture.vllm_route for a topology: vLLM's own connector on a GPU; on the CPU build the
    same connector with a host copy (its CUDA-stream copy fails there:
    eagle3/target_model/vllm_internals.py); decided at start by the installed vLLM for accelerator=auto."""
    return {"gpu": "native", "cuda": "native", "cpu": "native_host_copy"}.get(str(accelerator), "auto")
