"""Config schemas of training a head: ``head`` (its architecture), ``train`` (the loss, the
schedule, the run sizes' keys), and the Lightning run around it: ``logger``, ``trainer`` and
``callbacks``. Registered as ``base_<group>`` by eagle3/stages/compose.py; imports nothing of ours
beyond eagle3/config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from eagle3.config.choices import AttentionKind, HiddenStates, LossKind, LossTokens


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
    # EAGLE-3.1 norms, named as speculators 0.9 and vLLM 0.32 name them (eagle3/draft/config.py);
    # the defaults are head=eagle3's (conf/head/eagle3.yaml), head=compact turns them off
    norm_before_fc: bool = True  # one RMSNorm over the concatenated aux states before fc
    fc_norm: bool = False  # an RMSNorm per aux layer before fc (exclusive with norm_before_fc)
    norm_output: bool = True  # each TTT step reads the previous step's normed output
    norm_before_residual: bool = True  # the first layer's residual is the normed hidden state
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
    # answers. all: the better head in vLLM at equal GPU minutes, and no worse on the CPU demo
    # (docs/records/2026-12-01-equal-budget-vs-speculators.md, docs/changelog.md)
    loss_tokens: LossTokens = LossTokens.all
    # the on-policy objective (eagle3/draft/onpolicy.py): forward KL on the steps the current head's
    # own rounds accept, reverse KL at each round's first rejection, mixed in as
    # (1 - onpolicy_weight) x the supervised loss + onpolicy_weight x it. 0: the supervised loss alone,
    # bit for bit (the polish stage, eagle3/stages/polish.py, sets it)
    onpolicy_weight: float = 0.0
    # the rejected step k's reverse KL weighs onpolicy_decay^k: a rejection late in a chain costs
    # fewer served tokens than one at its first step
    onpolicy_decay: float = 0.8
    # true: only the rounds serving walks (starts right after the head's own rejections); false:
    # every answer position starts a chain of its own
    onpolicy_round_starts: bool = True
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
    # uniform noise on the aux hidden states of training batches, relative to each state's RMS
    # (eagle3/draft/feature_noise.py): 0.1 moves each state by up to a tenth of its size. 0: none
    feature_noise: float = 0.0
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
    # with num_workers 0: batches a thread of the training process reads ahead of the step
    # (eagle3/store/read_ahead.py); 0: the step's own thread reads each batch when it needs it.
    # On one H100 the fit took 0.61x of the time with 2 (the same head), on a 2-core CPU the same
    read_ahead: int = 2
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
