"""Typed settings of the vLLM acceptance evaluation, and the evaluation CLIs' primary schemas.

`EvalConfig` (what to measure: draft tokens, prompt counts, answer length, diagnostics) lives
in eagle3/config/schema.py because train.py's config carries it too. What is only
evaluate's -- how the two vLLM engines are built, where the head and the prompts come
from -- is here, registered in Hydra's ConfigStore as ``base_evaluate`` (conf/evaluate.yaml
extends it, so `python evaluate.py engine.max_num_seqs=abc` fails at compose time).
`python -m eagle3.stages.replay_export` (train-side acceptance of an export, no vLLM) has
its schema here too: ``base_replay_export``, extended by conf/replay_export.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from omegaconf import MISSING

from eagle3.config.engine import EngineOptions
from eagle3.config.schema import EvalConfig, LoggerConfig, PathsConfig
from eagle3.evaluation.serving_speedup import ServingCheck


@dataclass
class EvaluateConfig:
    """Primary schema of `python evaluate.py export_dir=<dir>`."""

    task_name: str = "evaluate"
    export_dir: str = MISSING
    # null: the export's speculators_config.verifier.name_or_path
    target: Optional[str] = None
    # the hidden-state dataset whose validation split gives the chat prompts;
    # null: the `dataset_dir` recorded in summary.json beside the export (train.py writes it)
    dataset_dir: Optional[str] = None
    # where acceptance.json/.png go; null: the export directory itself
    out_dir: Optional[str] = None
    # the chat template the dataset was rendered with, if it was overridden (model.chat_template)
    chat_template: Optional[str] = None
    # also run the target alone (tokens/s without the head, greedy-output check)
    baseline: bool = True
    eval: EvalConfig = field(default_factory=EvalConfig)
    engine: EngineOptions = field(default_factory=EngineOptions)
    # serving.measure=true: the serving measurement (loads x K, the export's serving.json) instead
    serving: ServingCheck = field(default_factory=ServingCheck)
    logger: LoggerConfig = MISSING
    paths: PathsConfig = MISSING


def register_evaluate_config() -> None:
    from hydra.core.config_store import ConfigStore

    from eagle3.stages.compose import register_configs

    register_configs()  # the shared groups (paths, logger) and resolvers
    ConfigStore.instance().store(name="base_evaluate", node=EvaluateConfig)


class ReplaySplit(str, Enum):
    val = "val"  # the dataset's validation split
    all = "all"  # every sample


@dataclass
class ReplayExportConfig:
    """Primary schema of `python -m eagle3.stages.replay_export export_dir=<dir> dataset_dir=<dir>`."""

    export_dir: str = MISSING
    # the hidden-state dataset whose answers the head is replayed on (its shards must be here)
    dataset_dir: str = MISSING
    # null: the export's speculators_config.verifier.name_or_path
    target: Optional[str] = None
    split: ReplaySplit = ReplaySplit.val
    num_draft_tokens: int = 3
    # answers cut at this many tokens, as eval.max_new_tokens cuts served ones; 0: whole answers
    max_answer_tokens: int = 128
    # each sample's first answer only (what evaluate replays: its prompts are opening turns)
    first_span_only: bool = False
    # null: cuda where available, else cpu
    device: Optional[str] = None
    # also write the figures as JSON to this file
    out: Optional[str] = None


def register_replay_export_config() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_replay_export", node=ReplayExportConfig)
