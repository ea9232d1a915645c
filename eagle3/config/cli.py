"""The primary schemas of the CLIs other than extract.py/train.py (whose ``RunConfig`` is in
schema.py): `python evaluate.py` (``EvaluateConfig``, with the serving measurement's
``ServingConfig``), `python export.py` (``ExportCliConfig``) and `python -m
eagle3.stages.replay_export` (``ReplayExportConfig``). Each is registered in Hydra's ConfigStore
as ``base_<cli>`` (eagle3/stages/compose.py) and extended by conf/<cli>.yaml, so a typo or a
wrong type fails at compose time.

`EvalConfig` (what the acceptance evaluation measures: draft tokens, prompt counts, answer length, diagnostics) lives
in schema.py, `LoggerConfig` in training.py, and `EngineOptions` (how the two vLLM engines are built) in engine.py because
train.py's config carries them too, under the same keys (eval.*, engine.*); what is only
evaluate's -- where the head and the prompts come from -- is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

from omegaconf import MISSING

from eagle3.config.engine import EngineOptions
from eagle3.config.schema import EvalConfig, PathsConfig
from eagle3.config.training import LoggerConfig


@dataclass
class ServingConfig:
    """What the serving measurement runs (the ``serving`` group of conf/evaluate.yaml)."""

    # run the serving measurement (loads x K) instead of the acceptance evaluation
    measure: bool = False
    loads: List[int] = field(default_factory=lambda: [1, 8, 32, 64])
    draft_tokens: List[int] = field(default_factory=lambda: [1, 2, 3, 5])
    # the held-out suite's opening turns (eagle3/evaluation/suite.py), an eighth each math word
    # problems and HumanEval; each load runs at natural EOS (the speed-ups printed and advised) and
    # as step-cost waves with ignore_eos (the step costs)
    prompts: int = 64
    # chat lines instead of the held-out suite
    prompts_jsonl: Optional[str] = None
    max_new_tokens: int = 128
    max_model_len: int = 2048
    # waves per load at least
    min_waves: int = 2
    # engine requests, results and logs; a rerun reuses finished engines. null: evaluate.py
    # takes <paths.cache_dir>/serving/<the export's key>, other callers serving_work/ beside the JSON
    work_dir: Optional[str] = None
    # the whole measurement's wall time: no engine starts that would end past it (an engine is
    # taken to last as long as the slowest so far); the table holds the K that finished
    max_minutes: Optional[float] = None
    # write the advice into the export (serving.json), which train.py and export.py then print
    write_advice: bool = True


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
    serving: ServingConfig = field(default_factory=ServingConfig)
    logger: LoggerConfig = MISSING
    paths: PathsConfig = MISSING


@dataclass
class ExportCliConfig:
    """Primary schema of `python export.py` (``base_export`` in Hydra's ConfigStore)."""

    ckpt: str = MISSING
    out: Optional[str] = None
    num_draft_tokens: Optional[int] = None
    # a Hub repo ("org/name") the export, its model card included, is uploaded to; the token and
    # the endpoint are checked before anything is exported (eagle3/serving/hub_push.py)
    push_to_hub: Optional[str] = None
    # the repo is created private (an existing repo keeps its visibility)
    hub_private: bool = True


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
