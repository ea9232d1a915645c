"""The training step's path, from the accelerator: settled once in the config so the logged
config says what ran."""

from __future__ import annotations

import torch

from eagle3.config.schema import AttentionKind, RunConfig, TopologyConfig
from eagle3.draft.flex import FLEX_BLOCK

# the one CPU capability check, shared with every target forward (capture, online, regeneration)
from eagle3.target.compute_dtype import cpu_has_native_bf16


def uses_flex(cfg: RunConfig) -> bool:
    return cfg.train.attention == AttentionKind.flex


def trains_on_cuda(topology: TopologyConfig) -> bool:
    accelerator = topology.accelerator
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(topology: TopologyConfig) -> None:
    """Settle topology.precision=auto: bf16 autocast over fp32 weights where the hardware runs
    bf16 matmuls natively (CUDA, a CPU with avx512_bf16/AMX), else fp32."""
    if topology.precision == "auto":
        native = trains_on_cuda(topology) or cpu_has_native_bf16()
        topology.precision = "bf16-mixed" if native else "32-true"


def resolve_step_path(cfg: RunConfig) -> None:
    """Settle topology.precision=auto, train.attention=auto and train.compile=null in cfg (so the
    logged config says what ran): on CUDA the compiled step with flex-attention TTT masks, the
    fastest path measured (bench/train_throughput.py); on CPU the eager dense-mask step.
    Explicit values are kept and checked."""
    resolve_precision(cfg.topology)
    cuda = trains_on_cuda(cfg.topology)
    tc = cfg.train
    if tc.attention == AttentionKind.auto:
        fits = tc.max_tokens_per_batch % FLEX_BLOCK == 0
        tc.attention = AttentionKind.flex if cuda and fits else AttentionKind.sdpa
        if cuda and not fits:
            print(
                f"train.attention=auto: sdpa, since train.max_tokens_per_batch={tc.max_tokens_per_batch} "
                f"is not a multiple of {FLEX_BLOCK} (flex tiles rows in {FLEX_BLOCK}-token blocks)"
            )
    if tc.compile is None:
        tc.compile = cuda
    if uses_flex(cfg):
        if tc.max_tokens_per_batch % FLEX_BLOCK:
            raise ValueError(
                f"train.max_tokens_per_batch: expected a multiple of {FLEX_BLOCK} with "
                f"train.attention=flex, got {tc.max_tokens_per_batch}"
            )
        if not cuda:
            raise ValueError(
                f"train.attention=flex: expected a CUDA accelerator, got topology.accelerator="
                f"{cfg.topology.accelerator} (FlexAttention has no backward on CPU); use sdpa or auto"
            )
