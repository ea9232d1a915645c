"""Pick the regeneration engine named by ``data.regen_backend``: vLLM or transformers."""

from __future__ import annotations

from pathlib import Path

from eagle3.target_model.generate.common import Regenerator, resolve_backend
from eagle3.target_model.generate.hf_engine import HFRegenerator
from eagle3.target_model.generate.vllm_engine import VLLMRegenerator


def make_regenerator(backend: str, target_dir: str, cache_dir: str | Path, **kwargs) -> Regenerator:
    """The engine for ``data.regen_backend`` (``auto``: vLLM when installed). Keyword arguments
    an engine does not take are dropped (the vLLM engine sizes, the HF batch)."""
    engine = resolve_backend(backend)
    vllm_only = ("cpu_kvcache_space_gb", "gpu_memory_utilization", "tensor_parallel_size")
    if engine == "vllm":
        kwargs.pop("gen_batch_size", None)
        kwargs.pop("static_cache", None)
        return VLLMRegenerator(target_dir, cache_dir, **kwargs)
    for k in vllm_only:
        kwargs.pop(k, None)
    return HFRegenerator(target_dir, cache_dir, **kwargs)
