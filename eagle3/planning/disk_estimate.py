"""What an extraction and a training will store, computed from config alone, so `--cfg job
--resolve` shows it before a GPU is booked:

    python extract.py model=kimi_k2_5 topology=gpu8_tp8 capture=vllm --cfg job --resolve
      capture.hidden_layout:      bfloat16 [T, 4, 7168]    (aux ids [2, 30, 58] + final 61)
      capture.storage_layout:     exact: hidden bfloat16 [T, 4, 7168]
      capture.bytes_per_token:    57,353 B
      capture.disk_per_1m_tokens: 53.4 GiB
      capture.dataset_disk:       <= 218.8 GiB (2,000 samples x <= 2,048 tokens)
    ... capture.storage=fp8 (the aux layers in float8 with a scale per token and layer):
      capture.bytes_per_token:    35,855 B (0.63x of exact bfloat16: 57,353 B)
      capture.dataset_disk:       <= 136.8 GiB (2,000 samples x <= 2,048 tokens)
    python train.py experiment=kimi_k2_5 --cfg job --resolve
      callbacks.model_checkpoint.disk: 12.7 GiB a checkpoint (1.14B trainable parameters), up to 3 at once: 38.2 GiB

The dtype is the capture dtype (the target's compute dtype), never its weight format: an
INT4 checkpoint computes, and so stores, bf16 hidden states. The disk figure is the one
extract.py checks against free space before it starts (eagle3.store.disk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from eagle3.util import hidden_dtypes

if TYPE_CHECKING:  # the store imports torch: only once a figure is resolved (composing stays light)
    from eagle3.store.storage_format import StorageFormat

MILLION = 1_000_000


def _check_dtype(dtype: str) -> str:
    return hidden_dtypes.check_name(
        dtype,
        hint="the hidden-state dtype, i.e. what the target computes in; "
        "a quantized weight format belongs in model.quantization",
    )


def hidden_layout(dtype: str, layer_ids: Sequence[int], hidden_size: int) -> str:
    """The hidden tensor per sample a reader gets, e.g. ``bfloat16 [T, 4, 7168]``."""
    return f"{_check_dtype(dtype)} [T, {len(layer_ids)}, {int(hidden_size)}]"


def storage_layout(
    dtype: str, layer_ids: Sequence[int], hidden_size: int, storage: StorageFormat, vocab_size: int | None = None
) -> str:
    """How the shards hold those states in ``storage`` (eagle3/store/storage_format.py); a top-k
    the target's vocabulary cannot give is refused."""
    k = storage.teacher_topk
    if k is not None and vocab_size is not None and k > int(vocab_size):
        raise ValueError(f"capture.teacher_topk: expected an integer in 1..{vocab_size} (model.vocab_size), got {k}")
    return storage.layout(_check_dtype(dtype), len(layer_ids), int(hidden_size))


# capture.teacher_topk where a GPU's HF capture stores fp8 or int4: the k whose head matched exact's
# acceptance in vLLM (docs/records/2026-12-05-storage-formats.md)
DEFAULT_TEACHER_TOPK = 32


def default_storage(accelerator: str, backend: str) -> str:
    """capture.storage where the capture group leaves it. fp8 on a CPU: a head trained from fp8
    shards measured the same acceptance in vLLM as from bf16 ones, and the writer threads encode
    faster than the CPU captures. fp8 (with the teacher's top-k, ``default_teacher_topk``) for the
    HF capture on a GPU: encoded and decoded on the device, it matched exact's acceptance in vLLM
    over two seeds on well under half the disk, and captured and trained faster. exact for vLLM's
    capture on a GPU: its writer threads' encode beside vLLM's engine held the capture well below
    exact's rate (docs/records/2026-12-05-storage-formats.md)."""
    from eagle3.store.storage_format import EXACT, FP8

    if str(accelerator) == "cpu" or str(backend) == "hf":
        return FP8
    return EXACT


def default_teacher_topk(accelerator: str, backend: str, kind: str) -> int | None:
    """capture.teacher_topk where the capture group leaves it, given capture.storage's ``kind``: the
    top-32 in place of the final layer for the HF capture on a GPU storing fp8 or int4; else None
    (the final layer kept). On a 2-core CPU the projection (hidden x vocab multiply-adds a token)
    slows the capture well below exact's rate (docs/records/2026-12-05-storage-formats.md); on a
    GPU it is free."""
    from eagle3.store.storage_format import StorageFormat

    gpu_hf = str(accelerator) != "cpu" and str(backend) == "hf"
    return DEFAULT_TEACHER_TOPK if gpu_hf and not StorageFormat(kind).is_exact else None


def bytes_per_token(layer_ids: Sequence[int], hidden_size: int, dtype: str, storage: StorageFormat) -> str:
    """Bytes one token takes in the dataset (hidden states, id, mask), and the ratio to exact."""
    from eagle3.store.disk import disk_needed_bytes
    from eagle3.store.storage_format import StorageFormat

    def per_token(fmt: StorageFormat) -> int:
        d = hidden_dtypes.torch_dtype(_check_dtype(dtype))
        L, H = len(layer_ids), int(hidden_size)
        return disk_needed_bytes(1, L, H, d, 0, 1, fmt) - disk_needed_bytes(0, L, H, d, 0, 1, fmt)

    mine, exact = per_token(storage), per_token(StorageFormat())
    return f"{mine:,} B" if storage.is_exact else f"{mine:,} B ({mine / exact:.2f}x of exact {dtype}: {exact:,} B)"


def dataset_disk(
    max_samples: int | None,
    max_length: int,
    layer_ids: Sequence[int],
    hidden_size: int,
    dtype: str,
    shard_max_tokens: int,
    storage: StorageFormat,
) -> str:
    """The dataset's bound on disk: every sample at data.max_length (what extract.py's disk check assumes)."""
    from eagle3.store.disk import format_bytes

    if max_samples is None:
        return "every sample of the data (counted once read): see disk_per_1m_tokens"
    tokens = int(max_samples) * int(max_length)
    size = disk_bytes(tokens, layer_ids, hidden_size, dtype, shard_max_tokens, storage)
    return f"<= {format_bytes(size)} ({int(max_samples):,} samples x <= {int(max_length):,} tokens)"


def disk_bytes(
    num_tokens: int,
    layer_ids: Sequence[int],
    hidden_size: int,
    dtype: str,
    shard_max_tokens: int,
    storage: StorageFormat,
) -> int:
    from eagle3.store.disk import disk_needed_bytes

    return disk_needed_bytes(
        int(num_tokens),
        len(layer_ids),
        int(hidden_size),
        hidden_dtypes.torch_dtype(_check_dtype(dtype)),
        0,
        int(shard_max_tokens),
        storage,
    )


def disk_per_million_tokens(
    layer_ids: Sequence[int], hidden_size: int, dtype: str, shard_max_tokens: int, storage: StorageFormat
) -> str:
    from eagle3.store.disk import format_bytes

    return format_bytes(disk_bytes(MILLION, layer_ids, hidden_size, dtype, shard_max_tokens, storage))


def checkpoint_disk(model: Any, head: Any, layer_ids: Sequence[int], save_top_k: int, save_last: bool) -> str:
    """One resume checkpoint of the head this config trains, and the disk a run holds at once
    (the figure train.py checks before its first step), from the model preset's facts: the head is
    built on the meta device, so nothing is allocated. A target whose facts are read only from its
    files says so instead."""
    try:
        import torch

        from eagle3.draft.head import Eagle3DraftHead
        from eagle3.store.disk import format_bytes
        from eagle3.target_model.resolve import PRESET_MODEL_TYPES
        from eagle3.training.builder import draft_config
        from eagle3.training.checkpoint_io import checkpoints_at_once, head_checkpoint_bytes

        facts = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
        hf = {key: getattr(model, key) for key in facts}
        if any(v is None for v in hf.values()):  # the sizes a preset leaves to the model's config.json
            hf = _config_json(model) | {k: v for k, v in hf.items() if v is not None}
            if any(hf.get(key) is None for key in facts):
                return "known once the target's config.json is read (train.py checks it before the first step)"
        else:
            hf.update(dict(model.extra_config or {}), model_type=PRESET_MODEL_TYPES.get(str(model.architecture), ""))
        with torch.device("meta"):
            draft = Eagle3DraftHead(draft_config(head, hf, len(layer_ids) - 1))
    except Exception as e:  # an estimate never stops a compose: the run itself names the problem
        return f"not estimated ({type(e).__name__}: {e})"
    each = head_checkpoint_bytes(draft)
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    at_once = checkpoints_at_once(int(save_top_k), bool(save_last))
    count = f"{trainable / 1e9:.2f}B" if trainable >= 1e9 else f"{trainable / 1e6:.1f}M"
    return (
        f"{format_bytes(each)} a checkpoint ({count} trainable parameters), "
        f"up to {at_once} at once: {format_bytes(at_once * each)}"
    )


def _config_json(model: Any) -> dict:
    """A model=hf target's config.json (a hub id's fetched alone, as its facts are), else {}."""
    import json

    from eagle3.target_model.hub import model_config_file

    if getattr(model.source, "value", model.source) != "hf" or not model.path:
        return {}
    cfg_file = model_config_file(str(model.path), model.revision)
    if not cfg_file.is_file():
        return {}
    cfg = json.loads(cfg_file.read_text())
    return dict(cfg.get("text_config") or cfg)


def vllm_capture_route(accelerator: str) -> str:
    """capture.vllm_route for a topology: vLLM's own connector on a GPU; on the CPU build the
    same connector with a host copy (its CUDA-stream copy fails there:
    eagle3/target_model/vllm_internals.py); decided at start by the installed vLLM for accelerator=auto."""
    return {"gpu": "native", "cuda": "native", "cpu": "native_host_copy"}.get(str(accelerator), "auto")
