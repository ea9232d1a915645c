"""The training step's path, settled once from the accelerator: the precision, attention kernel,
compilation and batch shape the step runs (a ``StepPath``), which train.py hands to the data
module, the head and the trainer, and records in place of auto/null in the logged config."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3.config.choices import AttentionKind
from eagle3.config.target import TopologyConfig
from eagle3.config.training import TrainConfig
from eagle3.draft.flex import FLEX_BLOCK

# the one CPU capability check, shared with every target forward (capture, online, regeneration)
from eagle3.target_model.compute_dtype import cpu_has_native_bf16


@dataclass(frozen=True)
class StepPath:
    """What the training step runs.

    cuda         the step runs on CUDA (batches are pinned for the copy there)
    precision    the Lightning precision (never auto)
    attention    sdpa or flex (never auto)
    compile      the step is torch.compile'd
    fixed_shape  every row padded to max_tokens_per_batch: a compiled step sees one shape (no
                 recompiles), flex tiles rows in FLEX_BLOCK-token blocks
    row_tokens   tokens per packed row; None: one row of max_tokens_per_batch (always with flex)
    note         why attention=auto did not pick the accelerator's fastest kernel, if it did not
    """

    cuda: bool
    precision: str
    attention: AttentionKind
    compile: bool
    fixed_shape: bool
    row_tokens: int | None
    note: str | None = None

    @property
    def flex(self) -> bool:
        return self.attention == AttentionKind.flex

    def line(self) -> str:
        """One log line, e.g. ``step path: cuda, bf16-mixed, flex, compiled, fixed shape, one row per batch``."""
        attention = self.attention.value + (f" ({self.note})" if self.note else "")
        rows = f"rows of {self.row_tokens} tokens" if self.row_tokens else "one row per batch"
        return (
            f"step path: {'cuda' if self.cuda else 'cpu'}, {self.precision}, {attention}, "
            f"{'compiled' if self.compile else 'eager'}, {'fixed shape' if self.fixed_shape else 'variable shape'}, "
            f"{rows}"
        )


def trains_on_cuda(topology: TopologyConfig) -> bool:
    accelerator = topology.accelerator
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(topology: TopologyConfig) -> str:
    """topology.precision, with auto settled: bf16 autocast over fp32 weights where the hardware
    runs bf16 matmuls natively (CUDA, a CPU with avx512_bf16/AMX), else fp32."""
    if topology.precision != "auto":
        return str(topology.precision)
    native = trains_on_cuda(topology) or cpu_has_native_bf16()
    return "bf16-mixed" if native else "32-true"


def resolve_step_path(train: TrainConfig, topology: TopologyConfig) -> StepPath:
    """The step for train.* on topology.*: on CUDA the compiled step with flex-attention TTT
    masks, the fastest path measured (bench/train_throughput.py); on CPU the eager dense-mask
    step. auto/null values are settled; explicit values are kept and checked."""
    cuda = trains_on_cuda(topology)
    tokens = int(train.max_tokens_per_batch)
    attention, note = AttentionKind(train.attention), None
    if attention == AttentionKind.auto:
        fits = tokens % FLEX_BLOCK == 0
        attention = AttentionKind.flex if cuda and fits else AttentionKind.sdpa
        if cuda and not fits:
            note = (
                f"train.max_tokens_per_batch={tokens} is not a multiple of {FLEX_BLOCK}: "
                f"flex tiles rows in {FLEX_BLOCK}-token blocks"
            )
    flex = attention == AttentionKind.flex
    if flex and tokens % FLEX_BLOCK:
        raise ValueError(
            f"train.max_tokens_per_batch: expected a multiple of {FLEX_BLOCK} with train.attention=flex, got {tokens}"
        )
    if flex and not cuda:
        raise ValueError(
            f"train.attention=flex: expected a CUDA accelerator, got topology.accelerator="
            f"{topology.accelerator} (FlexAttention has no backward on CPU); use sdpa or auto"
        )
    compiled = cuda if train.compile is None else bool(train.compile)
    return StepPath(
        cuda=cuda,
        precision=resolve_precision(topology),
        attention=attention,
        compile=compiled,
        fixed_shape=compiled or flex,
        row_tokens=None if flex else train.row_tokens,
        note=note,
    )
