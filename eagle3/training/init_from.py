"""`train.init_from`: warm-start the draft head from an existing EAGLE-3 head in the
speculators format (config.json + model.safetensors, eagle3/draft/serving_format.py):
an export directory, or a hub id resolved through the local HF cache (eagle3/target_model/hub.py).

The head must fit this run: hidden and vocabulary sizes, draft layers, attention and MLP
sizes, the norm flags and the aux layer ids it reads. Any difference is an error naming the
field, this run's value and the head's. Of these, the target fixes the hidden and vocabulary
sizes and head_dim; the rest are this run's choices (HEAD_FIELDS: the config key of each), which
a run that only continues training the head takes from its config.json (``head_overrides``:
polish.py's rounds).

The draft vocabulary is the head's own (d2t/t2d), kept even where the dataset's differs: the
head's lm_head rows were trained for those tokens, and the dataset's vocabulary is only the
frequency-ranked default of a fresh head (nothing else in training reads it). Remapping
rows onto the dataset's vocabulary would leave the tokens the head never saw untrained;
refusing would make every head trained on other data unusable. The coverage of both
vocabularies on this dataset is printed, so a poor fit shows.

The head's weights replace the fresh ones after the target's frozen pieces are loaded, so
init_from wins over `train.init_lm_head_from_target` (the lm_head is the head's). Resuming
a run (`ckpt_path`, or auto-resume in the run dir) loads its checkpoint over both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file

from eagle3.draft.config import NORM_OPTIONS, VLLM_NORM_DEFAULTS, DraftConfig
from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.serving_format import load_export_state_dict
from eagle3.target_model.hub import model_config_file, resolve_model_dir


class InitFromError(ValueError):
    pass


@dataclass
class InitHead:
    """An existing head read from disk: its config.json and its tensors."""

    source: str  # train.init_from as given
    directory: Path
    config: dict[str, Any]
    weights: dict[str, torch.Tensor]

    @property
    def where(self) -> str:
        return f"train.init_from={self.source!r} ({self.directory})"


def _head_config(path: Path) -> dict[str, Any]:
    config = json.loads(path.read_text())
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise InitFromError(f"{path}: speculators_model_type: expected 'eagle3', got {kind!r}")
    return config


def read_init_head(name: str, revision: Optional[str] = None) -> InitHead:
    directory = resolve_model_dir(name, revision, field="train.init_from", revision_field="train.init_from_revision")
    files = {f: directory / f for f in ("config.json", "model.safetensors")}
    absent = [f for f, p in files.items() if not p.is_file()]
    if absent:
        raise InitFromError(
            f"train.init_from={name!r}: {directory} has no {' or '.join(absent)} (expected an "
            "EAGLE-3 head in the speculators format: train.py's export directory or its hub id)"
        )
    config = _head_config(files["config.json"])
    weights = load_file(str(files["model.safetensors"]))
    lacking = [k for k in ("d2t", "t2d") if k not in weights]
    if lacking:
        raise InitFromError(f"{files['model.safetensors']}: no {lacking} tensors (the draft vocabulary mapping)")
    return InitHead(str(name), directory, config, weights)


def read_head_config(name: str, revision: Optional[str] = None) -> dict[str, Any]:
    """train.init_from's config.json alone (a hub id's file fetched without the weights)."""
    path = model_config_file(name, revision, field="train.init_from", revision_field="train.init_from_revision")
    if not path.is_file():
        raise InitFromError(
            f"train.init_from={name!r}: no {path} (expected an EAGLE-3 head in the speculators format: "
            "train.py's export directory or its hub id)"
        )
    return _head_config(path)


# The fields of a head's config.json that this run's config chooses (the target fixes the rest:
# hidden_size, vocab_size, head_dim): (the field as check_compatible names it, the config key
# that sets it, the DraftConfig attribute built from that key; None: the aux layer ids)
HEAD_FIELDS: tuple[tuple[str, str, Optional[str]], ...] = (
    ("draft_vocab_size", "head.draft_vocab_size", "draft_vocab_size"),
    ("num_hidden_layers", "head.num_draft_layers", "num_layers"),
    ("num_attention_heads", "head.num_attention_heads", "num_attention_heads"),
    ("num_key_value_heads", "head.num_key_value_heads", "num_key_value_heads"),
    ("intermediate_size", "head.intermediate_size", "intermediate_size"),
    ("eagle_aux_hidden_state_layer_ids", "layers.aux_ids", None),
    *((name, f"head.{name}", name) for name in NORM_OPTIONS),
)
_LAYER_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def head_value(config: dict[str, Any], field: str) -> Any:
    """``field``'s value in a head's config.json (a HEAD_FIELDS field); None where it is not stated.
    A norm flag the file lacks is what vLLM assumes for it (serving reads the head so), a layer
    count it lacks is 1."""
    if field in NORM_OPTIONS:
        return bool(config.get(field, VLLM_NORM_DEFAULTS[field]))
    if field in _LAYER_FIELDS:
        layer = config.get("transformer_layer_config") or {}
        return layer.get(field, 1 if field == "num_hidden_layers" else None)
    if field == "eagle_aux_hidden_state_layer_ids":
        ids = config.get(field)
        return None if ids is None else [int(i) for i in ids]
    return config.get(field)


def head_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """The config keys a head's config.json fixes (HEAD_FIELDS, those the file states), each with
    the head's value: what a run that continues training the head must be composed with. The aux
    layer ids are vLLM's, so layers.numbering=vllm comes with layers.aux_ids."""
    overrides = {key: head_value(config, field) for field, key, _ in HEAD_FIELDS}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "layers.aux_ids" in overrides:
        overrides["layers.numbering"] = "vllm"
    return overrides


def check_compatible(init: InitHead, draft_cfg: DraftConfig, aux_layer_ids: list[int]) -> None:
    """Every field the head's weights depend on must equal this run's; all differences are
    reported at once, each with this run's value (and where it comes from) and the head's."""
    cfg = init.config
    layer = cfg.get("transformer_layer_config") or {}
    d2t, t2d = init.weights["d2t"], init.weights["t2d"]
    # (field, this run's value, where this run takes it from, the head's value); None: not stated
    checks: list[tuple[str, Any, str, Any]] = [
        ("hidden_size", draft_cfg.hidden_size, "the target's hidden_size", layer.get("hidden_size")),
        ("target_hidden_size", draft_cfg.hidden_size, "the target's hidden_size", cfg.get("target_hidden_size")),
        ("vocab_size", draft_cfg.target_vocab_size, "the target's vocab_size", layer.get("vocab_size")),
        ("t2d length", draft_cfg.target_vocab_size, "the target's vocab_size", int(t2d.shape[0])),
        ("head_dim", draft_cfg.head_dim, "the target's head_dim", layer.get("head_dim")),
        ("d2t length", draft_cfg.draft_vocab_size, "head.draft_vocab_size", int(d2t.shape[0])),
    ]
    checks += [
        (
            field,
            getattr(draft_cfg, attr) if attr else [int(i) for i in aux_layer_ids],
            key if attr else f"the dataset's aux layers ({key})",
            head_value(cfg, field),
        )
        for field, key, attr in HEAD_FIELDS
    ]
    wrong = [
        f"{field}: expected {ours} ({source}), got {theirs}"
        for field, ours, source, theirs in checks
        if theirs is not None and (list(theirs) if isinstance(theirs, list) else theirs) != ours
    ]
    if wrong:
        raise InitFromError(
            f"{init.where} does not fit this run: "
            + "; ".join(wrong)
            + ". Set this run's values to the head's, or drop train.init_from to train a fresh head"
        )


def _coverage(t2d: torch.Tensor, token_freq: torch.Tensor) -> float:
    total = int(token_freq.sum())
    return float(token_freq[t2d.to(torch.bool)].sum()) / total if total else 0.0


def head_vocab(
    init: InitHead, dataset_d2t: torch.Tensor, dataset_t2d: torch.Tensor, token_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's own (d2t, t2d), the vocabulary its lm_head rows were trained for (see the
    module docstring); a difference from the dataset's is reported with both coverages."""
    d2t, t2d = init.weights["d2t"].to(torch.int64), init.weights["t2d"].to(torch.bool)
    if not torch.equal(t2d, dataset_t2d.to(torch.bool)):
        differ = int((t2d & ~dataset_t2d.to(torch.bool)).sum())
        print(
            f"{init.where}: keeps the head's draft vocabulary ({differ} of its {d2t.numel()} tokens are not in "
            f"the dataset's); it covers {_coverage(t2d, token_freq):.1%} of this dataset's answer tokens, "
            f"the dataset's own vocabulary {_coverage(dataset_t2d, token_freq):.1%}"
        )
    return d2t, t2d


def load_init_weights(init: InitHead, head: Eagle3DraftHead) -> None:
    """The head's trained tensors into `head` (after its target pieces are loaded). A trained
    embed_tokens in the file is left out: this run trains with the target's embeddings, and its
    export (without embed_tokens) is served with them."""
    weights = {k: v for k, v in init.weights.items() if not k.startswith("embed_tokens.")}
    if len(weights) != len(init.weights):
        print(f"{init.where}: its embed_tokens is not loaded (this run trains and serves with the target's)")
    load_export_state_dict(head, weights, f"{init.where}: model.safetensors does not fit the head built for this run")
