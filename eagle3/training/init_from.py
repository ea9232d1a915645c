"""`train.init_from`: warm-start the draft head from an existing EAGLE-3 head in the
speculators format (config.json + model.safetensors, eagle3/draft/serving_format.py):
an export directory, or a hub id resolved through the local HF cache (eagle3/target_model/hub.py).

The head must fit this run: hidden and vocabulary sizes, draft layers, attention and MLP
sizes, the norm flags and the aux layer ids it reads. Any difference is an error naming the
field, this run's value and the head's.

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
from eagle3.target_model.hub import resolve_model_dir


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


def read_init_head(name: str, revision: Optional[str] = None) -> InitHead:
    directory = resolve_model_dir(name, revision, field="train.init_from", revision_field="train.init_from_revision")
    files = {f: directory / f for f in ("config.json", "model.safetensors")}
    absent = [f for f, p in files.items() if not p.is_file()]
    if absent:
        raise InitFromError(
            f"train.init_from={name!r}: {directory} has no {' or '.join(absent)} (expected an "
            "EAGLE-3 head in the speculators format: train.py's export directory or its hub id)"
        )
    config = json.loads(files["config.json"].read_text())
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise InitFromError(f"{files['config.json']}: speculators_model_type: expected 'eagle3', got {kind!r}")
    weights = load_file(str(files["model.safetensors"]))
    lacking = [k for k in ("d2t", "t2d") if k not in weights]
    if lacking:
        raise InitFromError(f"{files['model.safetensors']}: no {lacking} tensors (the draft vocabulary mapping)")
    return InitHead(str(name), directory, config, weights)


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
        ("draft_vocab_size", draft_cfg.draft_vocab_size, "head.draft_vocab_size", cfg.get("draft_vocab_size")),
        ("d2t length", draft_cfg.draft_vocab_size, "head.draft_vocab_size", int(d2t.shape[0])),
        ("num_hidden_layers", draft_cfg.num_layers, "head.num_draft_layers", layer.get("num_hidden_layers", 1)),
        (
            "num_attention_heads",
            draft_cfg.num_attention_heads,
            "head.num_attention_heads",
            layer.get("num_attention_heads"),
        ),
        (
            "num_key_value_heads",
            draft_cfg.num_key_value_heads,
            "head.num_key_value_heads",
            layer.get("num_key_value_heads"),
        ),
        ("head_dim", draft_cfg.head_dim, "the target's head_dim", layer.get("head_dim")),
        ("intermediate_size", draft_cfg.intermediate_size, "head.intermediate_size", layer.get("intermediate_size")),
        (
            "eagle_aux_hidden_state_layer_ids",
            [int(i) for i in aux_layer_ids],
            "the dataset's aux layers (layers.aux_ids)",
            cfg.get("eagle_aux_hidden_state_layer_ids"),
        ),
    ]
    # a flag the file lacks means what vLLM assumes for it, as serving would read the head
    checks += [
        (name, bool(getattr(draft_cfg, name)), f"head.{name}", bool(cfg.get(name, VLLM_NORM_DEFAULTS[name])))
        for name in NORM_OPTIONS
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
