"""The run's typed config: ``RunConfig`` (the primary schema of extract.py and train.py) with
the groups that span the whole run (``paths``, ``eval``, ``export``, ``time_budget``), and the
conversions every stage uses (``typed``, ``run_config``, ``plain``).

Each group's dataclass is registered in Hydra's ConfigStore as ``base_<group>`` and every YAML
in ``conf/<group>/`` extends it in its defaults list, so a typo (``train.lrr=1``) or a
wrong type (``model.num_layers=abc``) fails at compose time with the key named. The groups'
schemas live by concern: the target and its machine in target.py, the dataset (data, capture) in
dataset.py, the head and its training in training.py, the enumerations in choices.py.
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

from eagle3.config.choices import BudgetRates, MixtureKind
from eagle3.config.dataset import CaptureConfig, DataConfig
from eagle3.config.engine import EngineOptions
from eagle3.config.errors import ConfigError
from eagle3.config.target import LayersConfig, ModelConfig, TopologyConfig
from eagle3.config.training import CallbacksConfig, HeadConfig, LoggerConfig, TrainConfig, TrainerConfig

DEFAULT_OPTIMIZED_METRIC = "val/replay_accept_len"  # RunConfig.optimized_metric; sweeps read it too


T = TypeVar("T")


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    datasets_dir: str = MISSING  # datasets (fingerprinted subdirectories)
    cache_dir: str = MISSING  # materialised targets, regenerated answers
    # the rates budgeted runs measured on this machine (eagle3/planning/machine_rates.py)
    machine_rates: str = MISSING
    log_dir: str = MISSING
    output_dir: Optional[str] = None  # the Hydra run dir (None under --cfg)


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
    # where vLLM gives no per-request spec-decode figures (CUDA vLLM 0.26), each request's histogram
    # rebuilt from the tokens each engine step adds to it, the sets run together and concurrently
    # (eagle3/evaluation/step_tally.py): per-prompt figures and bootstrap intervals at no cost, their
    # sums checked against the engine counters in every report (on CUDA vLLM 0.26 they agree:
    # docs/records/2026-12-07-cuda-figures-routes.md). Nothing changes where vLLM gives per-request
    # figures (0.32). false: the routes below
    step_figures: bool = True
    # with step_figures=false there: each prompt a generate() call of its own, the engine counters read
    # before it, between its two turns and after (one request in flight: its own figures, exact by
    # construction), at the cost of the batching; false too: each category one call, no intervals ("n/a")
    prompts_apart: bool = False
    # train.py: a failed evaluation ends it with an error (after the export and summary.json are
    # written); false: it exits 0, the failure said on its last line and in summary.json
    required: bool = False


@dataclass
class TimeBudgetConfig:
    """One wall-clock budget for the whole pipeline (eagle3/planning/time_budget.py): extract.py
    sizes the data so regeneration, capture and training at ``passes`` fit ``minutes``, and
    train.py trains for what the extraction (recorded in the dataset) and the evaluation leave."""

    minutes: Optional[float] = None  # null: no budget (the run sizes alone decide)
    passes: float = 2.0  # training passes over the data the shares aim at (their one knob)
    # where the shares' rates come from: what budgeted runs recorded on this machine (the table of
    # measured runs where nothing is recorded yet), or the table alone (``table``: a plan that does
    # not depend on earlier runs). A card faster than the table otherwise spends its spare minutes
    # re-reading the same data
    rates: BudgetRates = BudgetRates.machine
    # regeneration answers conversations until the end of its share, not only the count the shares
    # derive: a machine faster than planned buys more distinct data, not more passes over the same
    # (false: the planned count, a dataset that does not depend on the machine's speed)
    fill: bool = True


@dataclass
class SelectionConfig:
    """The set that picks the exported checkpoint, apart from the training source
    (eagle3/stages/selection.py): conversations of another source, answered by the target
    greedily and captured like the training data by extract.py into a dataset of their own, never
    trained on. With it, train.py's validation replays the head on it too (select/* beside val/*)
    and optimized_metric's val/<name> is read on it: the export is the checkpoint that drafts
    best on traffic it never saw, not on a held-out slice of the source it memorises."""

    samples: int = 0  # conversations in the set; 0: none (the validation split picks the export)
    # where they come from: prompts the target writes (self_prompts: no file, never the evaluation's
    # suites) or a chat file (jsonl/sharegpt at selection.path) other than the training source
    source: MixtureKind = MixtureKind.self_prompts
    path: Optional[str] = None
    seed: int = 1  # its draws; another seed than data.seed's, so its self-prompts are not training's


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
    selection: SelectionConfig = field(default_factory=SelectionConfig)
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
    # checkpoint. The replay at K = eval.num_draft_tokens tracks what vLLM measures
    # (docs/records/2026-12-01-train-side-estimates.md) and compares runs of different
    # train.ttt_steps; val/sim_accept_len grows with ttt_steps whatever the head, so a sweep over
    # it would favour the longest TTT
    optimized_metric: str = DEFAULT_OPTIMIZED_METRIC


# keys renamed in the schema: the old name, refused, names the new one
RENAMED_KEYS = {
    "paths.data_dir": "paths.datasets_dir",
    "eval.enforce_eager": "engine.enforce_eager",
}


def unknown_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """The dotted keys of ``node`` its schema's dataclasses do not declare (Hydra's ``+key=``
    adds them to a structured config; converting it to the dataclass would drop them unread).
    A field typed ``Any`` holding a dict (``callbacks.extra``, ``model.extra_config``) is free."""
    kind = OmegaConf.get_type(node)
    declared = {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else None
    found: list[str] = []
    for key in node.keys():
        name = f"{prefix}{key!s}"
        if declared is not None and key not in declared:
            found.append(name)
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            found += unknown_keys(child, f"{name}.")
    return found


def refuse_unknown_keys(cfg: DictConfig) -> None:
    """``ConfigError`` naming each key of ``cfg`` that its schema lacks (a renamed one with its
    new name), before any work."""
    unknown = unknown_keys(cfg)
    if not unknown:
        return
    named = [f"{k!r} (renamed: {RENAMED_KEYS[k]})" if k in RENAMED_KEYS else repr(k) for k in unknown]
    raise ConfigError(
        f"unknown config key(s) {', '.join(named)}: not in the schema (eagle3/config/); `+key=value` adds a "
        "key Hydra's schema would refuse, and nothing reads it. Set an existing key (`key=value`; "
        "`python train.py --cfg job` lists them)"
    )


def typed(cfg: Any, schema: type[T]) -> T:
    """A composed config as its schema's dataclass (interpolations resolved, enums as members,
    every group its dataclass); an instance of the schema is returned as it is. A key the schema
    lacks is refused (``refuse_unknown_keys``)."""
    if isinstance(cfg, DictConfig):
        refuse_unknown_keys(cfg)
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
