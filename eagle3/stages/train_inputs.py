"""What train.py reads: the dataset of this config (stored hidden states, or a token dataset
for train.hidden_states=online) or the one dataset_dir= names, checked against the config and
the target's weights; and, online, the frozen target each training process runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eagle3.config.choices import LossKind, Strategy
from eagle3.config.schema import RunConfig
from eagle3.extraction.identity import (
    DatasetNotFound,
    recorded_weights,
    regen_note,
    weights_mismatch,
)
from eagle3.extraction.locate import locate_dataset
from eagle3.stages.narrow import dataset_identity, regen_machine
from eagle3.stages.validate import config_torch_dtype
from eagle3.store import FingerprintMismatchError, Manifest
from eagle3.training.online import OnlineHiddenStates


def online_target(
    cfg: RunConfig, target_dir: str, fixed_shape: bool, row_tokens: int | None, layer_ids: Sequence[int]
) -> OnlineHiddenStates:
    """train.hidden_states=online: the frozen target each training process runs (a full copy
    per process), capturing ``layer_ids``: the token dataset's (its manifest's), the ids the
    head and the export declare."""
    if cfg.topology.strategy == Strategy.fsdp:
        raise ValueError(
            "train.hidden_states=online: expected topology.strategy auto or ddp (each process holds a "
            "whole copy of the target), got fsdp; for a target that needs sharding, extract the hidden "
            "states with capture=vllm and tensor parallelism and train offline (docs/scaling.md)"
        )
    print(f"hidden states: online, the target ({target_dir}) runs with transformers on each training device")
    return OnlineHiddenStates(
        target_dir,
        [int(i) for i in layer_ids],
        cfg.model.hidden_size,
        config_torch_dtype(cfg.capture.dtype),
        max_tokens_per_batch=cfg.train.max_tokens_per_batch,
        row_tokens=row_tokens,
        fixed_shape=fixed_shape,
        forward_tokens=cfg.capture.max_tokens_per_batch,
        trust_remote_code=cfg.model.trust_remote_code,
    )


def find_token_dataset(cfg: RunConfig, target_dir: str) -> Path:
    """dataset_dir= as given (a token dataset), checked against the config and the target (layer
    ids, hidden size, weights: ``check_given_dataset``), else this config's, written now if missing
    (the pre-pass: samples, split and vocabulary; `extract.py train.hidden_states=online`
    runs it alone)."""
    if cfg.dataset_dir:
        dataset_dir = Path(cfg.dataset_dir).expanduser().resolve()
        manifest = Manifest.read(dataset_dir)
        if manifest.hidden_states != "online":
            raise ValueError(
                f"dataset_dir={cfg.dataset_dir}: holds stored hidden states; train.hidden_states=online "
                "reads a token dataset (python extract.py train.hidden_states=online <same overrides>)"
            )
        check_given_dataset(cfg, dataset_dir, manifest, target_dir)
        return dataset_dir
    from eagle3.extraction.tokens import prepare_token_dataset

    return prepare_token_dataset(dataset_identity(cfg, target_dir), regen_machine(cfg), cfg.head.draft_vocab_size)


def find_dataset(cfg: RunConfig, target_dir: str) -> Path:
    """dataset_dir= as given, checked against the config and the target (``check_given_dataset``);
    else the fingerprinted directory (eagle3.extraction.locate.locate_dataset). Prints which
    engine wrote its answers."""
    if not cfg.dataset_dir:
        dataset_dir, note = locate_dataset(dataset_identity(cfg, target_dir))
        print(f"dataset {dataset_dir}: {regen_note(Manifest.read(dataset_dir))}" + (f" ({note})" if note else ""))
        return dataset_dir
    dataset_dir = Path(cfg.dataset_dir).expanduser().resolve()
    if not (dataset_dir / "manifest.json").is_file():
        raise DatasetNotFound(
            f"dataset_dir={cfg.dataset_dir}: no manifest.json there (expected a directory extract.py wrote)"
        )
    manifest = Manifest.read(dataset_dir)
    check_given_dataset(cfg, dataset_dir, manifest, target_dir)
    print(f"dataset {dataset_dir}: {regen_note(manifest)}")
    return dataset_dir


def check_loss_fits_teacher(cfg: RunConfig, dataset_dir: Path, manifest: Manifest) -> None:
    """train.loss=reverse_kl (or the on-policy objective, whose rejections take a reverse KL)
    against a dataset holding the teacher's top-k is refused: outside the
    top-k the stored teacher is 0 (its logit -1e4, eagle3/draft/teacher.py), and KL(q || p) charges
    each unit of draft mass there ~1e4, a loss and gradients that drown everything else. The
    forward KL, JSD and TV are bounded there (forward KL sees the truncated teacher exactly)."""
    topk = manifest.storage.teacher_topk
    if topk is not None and cfg.train.onpolicy_weight > 0:
        raise ValueError(
            f"train.onpolicy_weight: expected 0 with {dataset_dir} (its shards hold the teacher's top-{topk}, "
            f"capture.teacher_topk, not its whole distribution), got {cfg.train.onpolicy_weight}: the on-policy "
            "objective's reverse KL at each rejection would charge ~1e4 per unit of draft mass outside the top-k; "
            "extract with capture.teacher_topk=null for it"
        )
    if topk is not None and cfg.train.loss == LossKind.reverse_kl:
        raise ValueError(
            f"train.loss: expected forward_kl, ce_argmax, jsd or tv with {dataset_dir} (its shards hold the "
            f"teacher's top-{manifest.storage.teacher_topk}, capture.teacher_topk, not its whole distribution), "
            "got reverse_kl: it would charge ~1e4 per unit of draft mass outside the top-k; train from a "
            "dataset that holds the final layer (capture.teacher_topk=null) for reverse_kl"
        )


def check_given_dataset(cfg: RunConfig, dataset_dir: Path, manifest: Manifest, target_dir: str) -> None:
    """A dataset named by dataset_dir= holds this config's layer ids and hidden size, and was
    extracted from this target's weights (the sampled hashes its manifest holds), unless
    dataset_other_weights=true accepts other weights on purpose."""
    want_ids, want_hidden = [int(i) for i in cfg.layers.layer_ids], cfg.model.hidden_size
    got_ids, got_hidden = list(manifest.layer_ids), int(manifest.hidden_size)
    if got_ids != want_ids or got_hidden != want_hidden:
        raise ValueError(
            f"dataset_dir={cfg.dataset_dir}: {dataset_dir / 'manifest.json'}: layer_ids, hidden_size: expected "
            f"{want_ids}, {want_hidden}, got {got_ids}, {got_hidden}: it holds layers {got_ids} of hidden size "
            f"{got_hidden}, but model={cfg.model.name} with these layers expects layers {want_ids} of hidden size "
            f"{want_hidden}; pass the layers it holds (layers.aux_ids=...) or extract this config's dataset"
        )
    if recorded_weights(manifest) is None:
        print(
            f"dataset_dir={cfg.dataset_dir}: its manifest holds no weights hashes (first fingerprint scheme): "
            "not checked against the target's weights"
        )
        return
    problem = weights_mismatch(dataset_dir, manifest, target_dir, cfg.paths.cache_dir)
    if problem is None:
        return
    if cfg.dataset_other_weights:
        print(f"dataset_dir={cfg.dataset_dir}: {problem}; accepted (dataset_other_weights=true)")
        return
    raise FingerprintMismatchError(
        f"dataset_dir={cfg.dataset_dir}: {problem}: it was extracted from another model's weights (of the same "
        "shape: base vs instruct, another revision or fine-tune). Extract this target's dataset, or pass "
        "dataset_other_weights=true to train on it anyway"
    )
