"""Build the draft head for a dataset: sizes from the target, frozen pieces copied from it,
layer ids and vocabulary from the dataset (one source of truth, never re-typed)."""

from __future__ import annotations

from eagle3.config.choices import AttentionKind, ModelSource
from eagle3.config.target import ModelConfig
from eagle3.config.training import HeadConfig, TrainConfig
from eagle3.data.vocab import build_draft_vocab
from eagle3.draft.config import NORM_OPTIONS, DraftConfig
from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.serving_format import DraftMeta
from eagle3.store import HiddenStateDataset, TokenDataset, add_vocab
from eagle3.target_model.resolve import load_target_head_weights, read_hf_config
from eagle3.training.init_from import check_compatible, head_vocab, load_init_weights, read_init_head


def draft_vocab(dataset: HiddenStateDataset | TokenDataset, size: int):
    """The dataset's vocabulary of this size, built from its token counts on first use."""
    if size not in dataset.vocab_sizes:
        d2t, t2d = build_draft_vocab(dataset.token_freq(), size)
        dataset.manifest.vocabs[str(size)] = add_vocab(dataset.directory, size, d2t, t2d).name
    return dataset.load_vocab(size)


def target_name(model: ModelConfig, target_dir: str, given: str | None = None) -> str:
    """The target as the export names it: a name the serving machine can resolve (``given``,
    export.target_name_or_path; else the hub id, or the path the user gave), not this
    machine's materialised cache directory."""
    if given:
        return given
    if model.hub_id:
        return model.hub_id
    if model.source == ModelSource.hf and model.path:
        return model.path
    return str(target_dir)


def draft_vocab_size(head: HeadConfig, hf: dict) -> int:
    """head.draft_vocab_size, or the target's whole vocabulary where that is smaller."""
    return min(head.draft_vocab_size, int(hf["vocab_size"]))


def draft_config(head: HeadConfig, hf: dict, num_aux_layers: int) -> DraftConfig:
    """The head's architecture: the target's sizes (``hf``, its config.json) with head.*'s
    overrides and norm flags."""
    overrides = {
        k: getattr(head, k)
        for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size")
        if getattr(head, k) is not None
    }
    norms = {name: bool(getattr(head, name)) for name in NORM_OPTIONS}  # head.<name>, same names as DraftConfig
    return DraftConfig.from_target_config(
        hf,
        draft_vocab_size=draft_vocab_size(head, hf),
        num_aux_layers=num_aux_layers,
        num_layers=head.num_draft_layers,
        **norms,
        **overrides,
    )


def build_head(
    head_cfg: HeadConfig,
    train: TrainConfig,
    model: ModelConfig,
    target_dir: str,
    dataset: HiddenStateDataset | TokenDataset,
    *,
    attention: AttentionKind,
    target: str,
    num_speculative_tokens: int,
) -> tuple[Eagle3DraftHead, DraftMeta]:
    """The head head.* describes, initialised as train.* says, for the target ``model`` (its files in ``target_dir``) and
    ``dataset``, with the settled ``attention`` kernel (never auto), and the DraftMeta its
    export carries: ``target`` as the export names it, ``num_speculative_tokens`` advised."""
    hf = read_hf_config(target_dir)
    size = draft_vocab_size(head_cfg, hf)
    layer_ids = list(dataset.layer_ids)
    final_id = model.num_layers
    if layer_ids[-1] != final_id:
        raise ValueError(f"{dataset.directory}: last layer id {layer_ids[-1]} is not the final state {final_id}")
    aux_layer_ids = layer_ids[:-1]
    draft_cfg = draft_config(head_cfg, hf, len(aux_layer_ids))
    head = Eagle3DraftHead(draft_cfg, attention=AttentionKind(attention).value)
    d2t, t2d = draft_vocab(dataset, size)
    init = read_init_head(train.init_from, train.init_from_revision) if train.init_from else None
    if init is not None:  # warm start: the head must fit, and keeps the vocabulary it was trained for
        check_compatible(init, draft_cfg, aux_layer_ids)
        d2t, t2d = head_vocab(init, d2t, t2d, dataset.token_freq())
    w = load_target_head_weights(target_dir)
    head.load_target_weights(
        w["embed"].float(),
        w["norm"].float(),
        w["lm_head"].float(),
        d2t,
        t2d,
        init_lm_head_from_target=train.init_lm_head_from_target,
    )
    if init is not None:  # after the target's pieces: init_from wins over init_lm_head_from_target
        load_init_weights(init, head)
    meta = DraftMeta(
        draft_config=draft_cfg,
        aux_layer_ids=aux_layer_ids,
        target_name_or_path=target,
        target_architectures=list(hf.get("architectures") or [model.architecture]),
        num_speculative_tokens=num_speculative_tokens,
        serve_trust_remote_code=bool(model.trust_remote_code),
    )
    return head, meta
