"""Build the draft head for a dataset: sizes from the target, frozen pieces copied from it,
layer ids and vocabulary from the dataset (one source of truth, never re-typed)."""

from __future__ import annotations

from eagle3.config.schema import ModelSource, RunConfig
from eagle3.data.vocab import build_draft_vocab
from eagle3.draft.config import NORM_OPTIONS, DraftConfig
from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.serving_format import DraftMeta
from eagle3.store import HiddenStateDataset, TokenDataset, add_vocab
from eagle3.target.resolve import load_target_head_weights, read_hf_config
from eagle3.training.init_from import check_compatible, head_vocab, load_init_weights, read_init_head
from eagle3.training.step_path import resolve_step_path


def draft_vocab(dataset: HiddenStateDataset | TokenDataset, size: int):
    """The dataset's vocabulary of this size, built from its token counts on first use."""
    if size not in dataset.vocab_sizes:
        d2t, t2d = build_draft_vocab(dataset.token_freq(), size)
        dataset.manifest.vocabs[str(size)] = add_vocab(dataset.directory, size, d2t, t2d).name
    return dataset.load_vocab(size)


def verifier_name(cfg: RunConfig, model_dir: str) -> str:
    """The verifier as the export names it: a name the serving machine can resolve (the hub id,
    or the path the user gave), not this machine's materialised cache directory."""
    if cfg.export.verifier_name_or_path:
        return cfg.export.verifier_name_or_path
    if cfg.model.hub_id:
        return cfg.model.hub_id
    if cfg.model.source == ModelSource.hf and cfg.model.path:
        return cfg.model.path
    return str(model_dir)


def build_head(
    cfg: RunConfig, model_dir: str, dataset: HiddenStateDataset | TokenDataset
) -> tuple[Eagle3DraftHead, DraftMeta]:
    resolve_step_path(cfg)  # train.attention=auto -> the kernel for this accelerator
    hf = read_hf_config(model_dir)
    target_vocab = int(hf["vocab_size"])
    size = min(cfg.train.draft_vocab_size, target_vocab)
    layer_ids = list(dataset.layer_ids)
    final_id = cfg.model.num_layers
    if layer_ids[-1] != final_id:
        raise ValueError(f"{dataset.directory}: last layer id {layer_ids[-1]} is not the final state {final_id}")
    aux_ids = layer_ids[:-1]
    overrides = {
        k: getattr(cfg.train, k)
        for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size")
        if getattr(cfg.train, k) is not None
    }
    norms = {name: bool(getattr(cfg.train, name)) for name in NORM_OPTIONS}  # train.<name>, same names as DraftConfig
    draft_cfg = DraftConfig.from_target_config(
        hf,
        draft_vocab_size=size,
        num_aux_layers=len(aux_ids),
        num_layers=cfg.train.num_draft_layers,
        **norms,
        **overrides,
    )
    head = Eagle3DraftHead(draft_cfg, attention=cfg.train.attention.value)
    d2t, t2d = draft_vocab(dataset, size)
    init = read_init_head(cfg.train.init_from, cfg.train.init_from_revision) if cfg.train.init_from else None
    if init is not None:  # warm start: the head must fit, and keeps the vocabulary it was trained for
        check_compatible(init, draft_cfg, aux_ids)
        d2t, t2d = head_vocab(init, d2t, t2d, dataset.token_freq())
    w = load_target_head_weights(model_dir)
    head.load_target_weights(
        w["embed"].float(),
        w["norm"].float(),
        w["lm_head"].float(),
        d2t,
        t2d,
        init_lm_head_from_target=cfg.train.init_lm_head_from_target,
    )
    if init is not None:  # after the target's pieces: init_from wins over init_lm_head_from_target
        load_init_weights(init, head)
    meta = DraftMeta(
        draft_config=draft_cfg,
        aux_layer_ids=aux_ids,
        verifier_name_or_path=verifier_name(cfg, model_dir),
        verifier_architectures=list(hf.get("architectures") or [cfg.model.architecture]),
        num_speculative_tokens=cfg.eval.num_draft_tokens,
    )
    return head, meta
