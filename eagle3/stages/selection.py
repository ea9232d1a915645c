"""The selection set (``selection.*``): conversations apart from the training source that pick
the exported checkpoint.

A validation split is a slice of the training source: a head that has learnt that source's
habits scores well on it while drafting no better, or worse, on traffic it never saw. The
selection set comes from elsewhere (by default prompts the target writes about broad topics,
seeded apart from any training mixture's), answered by the target greedily as serving would,
and captured by extract.py into a dataset of its own (same model, layers, capture and storage;
its own fingerprint), never trained on. train.py replays the head on it at each validation
(``select/*`` metrics beside ``val/*``) and reads optimized_metric there: ``val/<name>`` names
what is measured, the selection set where.

This module derives that dataset's config from the run's and finds it; extract.py writes it
before the training data (eagle3/stages/extract.py), train.py hands it to the data module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from eagle3.config.choices import HiddenStates, MixtureKind
from eagle3.config.dataset import MixtureSource
from eagle3.config.errors import ConfigError
from eagle3.config.schema import RunConfig
from eagle3.extraction.identity import DatasetNotFound
from eagle3.extraction.locate import locate_dataset
from eagle3.stages.narrow import dataset_identity

SOURCE_NAME = "select"  # its samples' tag: "select/<id>"
VAL_PREFIX, SELECT_PREFIX = "val/", "select/"


def selection_config(cfg: RunConfig) -> RunConfig | None:
    """The run config whose dataset is cfg's selection set (None: selection.samples is 0): cfg's
    model, layers, capture and sizes; data one source of selection.samples conversations, every
    one answered by the target greedily, none held out; no time budget of its own (its minutes are
    part of the run's plan: eagle3/planning/time_budget.py)."""
    sel = cfg.selection
    if sel.samples <= 0:
        return None
    if cfg.train.hidden_states == HiddenStates.online:
        raise ConfigError(
            f"selection.samples={sel.samples}: expected 0 with train.hidden_states=online (the set is a dataset "
            "of stored hidden states), got a selection set"
        )
    kind = MixtureKind(getattr(sel.source, "value", sel.source))
    if kind != MixtureKind.self_prompts and not sel.path:
        raise ConfigError(
            f"selection.source={kind.value}: expected selection.path, a chat file apart from the training data "
            "(the package's ShareGPT file is the training source's own), got null"
        )
    entry = MixtureSource(name=SOURCE_NAME, source=kind, path=sel.path, max_samples=int(sel.samples))
    data = dataclasses.replace(
        cfg.data,
        name=f"{cfg.data.name}-select",
        mixture=[entry],
        max_samples=int(sel.samples),
        val_fraction=0.0,
        seed=int(sel.seed),
        regenerate=True,
        regen_temperature=0.0,
        regen_num_answers=1,
    )
    budget = dataclasses.replace(cfg.time_budget, minutes=None)
    return dataclasses.replace(
        cfg, data=data, time_budget=budget, selection=dataclasses.replace(sel, samples=0), dataset_dir=None
    )


def find_selection(cfg: RunConfig, target_dir: str) -> Path | None:
    """The selection set's dataset of cfg (None without one); missing, an error naming the
    extract.py command that writes it (the same overrides as this run's)."""
    picked = selection_config(cfg)
    if picked is None:
        return None
    try:
        dataset_dir, _ = locate_dataset(dataset_identity(picked, target_dir))
    except DatasetNotFound as e:
        raise DatasetNotFound(
            f"selection.samples={cfg.selection.samples}: the selection set's dataset is not there; "
            f"`python extract.py <this run's overrides>` writes it (or selection.samples=0 picks the export on "
            f"the validation split): {e}"
        ) from None
    return dataset_dir


def picking_metric(metric: str, has_selection: bool) -> str:
    """optimized_metric as read: val/<name> on the selection set where there is one."""
    if has_selection and metric.startswith(VAL_PREFIX):
        return SELECT_PREFIX + metric[len(VAL_PREFIX) :]
    return metric


def selection_line(picked: RunConfig) -> str:
    data = picked.data
    where = data.mixture[0].path if data.mixture and data.mixture[0].path else "prompts the target writes"
    return (
        f"selection set: {data.max_samples:,} conversations ({where}, seed {data.seed}) answered by the "
        "target and captured apart from the training data; they pick the exported checkpoint"
    )
