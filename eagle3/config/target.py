"""Config schemas of the target model and the machine it runs on: ``model`` (what the target
is and where its weights come from), ``layers`` (which of its layers feed the head) and
``topology`` (devices, parallelism, precision). Registered as ``base_<group>`` by
eagle3/stages/compose.py; imports nothing of ours beyond eagle3/config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from eagle3.config.choices import LayerNumbering, ModelSource, Quantization, Strategy


@dataclass
class ModelConfig:
    name: str = MISSING
    source: ModelSource = ModelSource.hf
    # local HF directory or hub id (source=hf); ignored for the embedded/tiny presets
    path: Optional[str] = None
    # hub id only: the branch, tag or commit to load (null: main); every stage loads that snapshot
    revision: Optional[str] = None
    architecture: str = MISSING  # transformers class name, e.g. LlamaForCausalLM
    num_layers: int = MISSING
    hidden_size: int = MISSING
    vocab_size: int = MISSING
    num_attention_heads: Optional[int] = None
    num_key_value_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    # dtype the target computes in, and so the dtype of captured hidden states
    dtype: str = "bfloat16"
    # how vLLM runs the served target's weights (choices.Quantization: fp8, compressed_tensors, awq,
    # gptq); null: as the checkpoint is (its own quantization_config, if any, is detected and
    # recorded). Every vLLM engine of the run gets it (regeneration, capture, evaluation, serving
    # measurement), the printed `vllm serve` line says it, and the dataset's fingerprint holds it
    # when set. Never the hidden-state dtype (capture.dtype). The HF capture and regeneration
    # cannot run it: refused at compose (eagle3/stages/validate.py)
    quantization: Optional[Quantization] = None
    # None: the tokenizer's own chat template (what vLLM serves). A string overrides it.
    chat_template: Optional[str] = None
    # tiny presets: the tokenizer is borrowed from this preset (real vocab, real template)
    tokenizer_from: Optional[str] = None
    # tiny presets: extra transformers config fields (experts, rope, ...)
    extra_config: Any = field(default_factory=dict)
    seed: int = 0
    # the model's own code from its repository (transformers and vLLM loads); off: refuse it
    trust_remote_code: bool = False
    # the name a serving machine knows this target by (a hub id), written into exports as the
    # target; null: model.path as given (source=hf), else the local directory
    hub_id: Optional[str] = None


@dataclass
class TopologyConfig:
    accelerator: str = "cpu"  # cpu | gpu
    devices: int = 1  # per node
    num_nodes: int = 1
    extract_tp: int = 1  # vLLM tensor_parallel_size
    extract_dp: int = 1  # data-parallel extraction replicas
    strategy: Strategy = Strategy.auto  # training: auto | ddp | fsdp
    # Lightning precision (32-true, bf16-mixed, ...). auto: bf16-mixed on CUDA and on a CPU with
    # native bf16 matmuls (avx512_bf16 / AMX: a much faster step than fp32,
    # docs/records/2026-12-01-make-demo.md), else 32-true
    precision: str = "auto"


@dataclass
class LayersConfig:
    # null: the EAGLE-3 default [2, N//2, N-3]; or an explicit list in `numbering`'s ids
    aux_ids: Optional[List[int]] = None
    numbering: LayerNumbering = LayerNumbering.vllm
    # computed by resolvers from aux_ids/numbering/model.num_layers (set in layers/*.yaml,
    # shown by --cfg job --resolve); never set these by hand
    aux_layer_ids: Any = None
    layer_ids: Any = None
