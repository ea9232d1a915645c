"""Train-side acceptance of an exported head on a hidden-state dataset, with no vLLM (its CLI:
``python -m eagle3.stages.replay_export``).

Measures both train-side figures for the same positions: the uniform estimate (every answer
position starts a chain: `sim_accept_len` at K) and the round-structured replay
(eagle3/draft/replay.py: rounds start where serving would start them). On a dataset of the
target's own greedy answers the replay is the figure vLLM's counters should reproduce on
the same prompts within a few hundredths (docs/records/2026-12-01-train-side-estimates.md); a larger gap points
at a train/serve mismatch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.loss import StepCounts, eagle3_loss
from eagle3.draft.replay import replay_counts, replay_metrics
from eagle3.draft.serving_format import load_head
from eagle3.store import HiddenStateDataset, shards_on_disk
from eagle3.store.packing import unshuffled_loader
from eagle3.target_model.resolve import load_target_head_weights, read_hf_config


def load_exported_head(export_dir: str | Path, target: str | Path) -> tuple[Eagle3DraftHead, list[int]]:
    """The exported head as an Eagle3DraftHead (frozen parts from the target), and its aux ids."""
    loaded = load_head(export_dir, read_hf_config(str(target)), load_target_head_weights(str(target)))
    return loaded.head, loaded.aux_layer_ids


@torch.no_grad()
def train_side_figures(
    head: Eagle3DraftHead,
    dataset_dir: str,
    *,
    num_draft_tokens: int,
    max_answer_tokens: int | None,
    split: str = "val",
    sample_ids: list[str] | None = None,
    first_span_only: bool = False,
    max_tokens_per_batch: int = 4096,
    device: str = "cpu",
) -> dict[str, float]:
    """Uniform and replayed acceptance of `head` on a split ("val" | "all") of the dataset,
    or on the samples named by `sample_ids`."""
    dataset = HiddenStateDataset(dataset_dir)
    if sample_ids is not None:
        wanted = set(sample_ids)
        idx = [i for i, sid in enumerate(dataset.sample_ids) if sid in wanted]
        if len(idx) != len(wanted):
            raise ValueError(f"{dataset_dir}: {len(wanted) - len(idx)} of {len(wanted)} sample ids not in the dataset")
    else:
        idx = sorted(set(dataset.val_indices())) if split == "val" else list(range(len(dataset)))
    loader = unshuffled_loader(dataset, idx, max_tokens=max_tokens_per_batch)
    head = head.to(device)
    counts, replay = StepCounts.zeros(num_draft_tokens), torch.zeros(2 + num_draft_tokens, dtype=torch.float64)
    for batch in loader:
        counts, replay = add_batch(
            head,
            batch,
            counts,
            replay,
            num_draft_tokens=num_draft_tokens,
            max_answer_tokens=max_answer_tokens,
            first_span_only=first_span_only,
            device=device,
        )
    return figures(counts, replay, num_draft_tokens, len(idx))


def add_batch(
    head: Eagle3DraftHead,
    batch: dict[str, torch.Tensor],
    counts: StepCounts,
    replay: torch.Tensor,
    *,
    num_draft_tokens: int,
    max_answer_tokens: int | None,
    first_span_only: bool,
    device: str,
):
    """(counts, replay) with one collated batch added: uniform step counts and replayed rounds."""
    batch = {k: v.to(device) for k, v in batch.items()}
    steps = head(batch["aux_hidden"], batch["input_ids"], batch["position_ids"], batch["segment_ids"], num_draft_tokens)
    target, covered = head.teacher_logits(batch)  # from the final state or the stored top-k
    _, c = eagle3_loss(
        steps, target, loss_mask=batch["loss_mask"], segment_ids=batch["segment_ids"], step_decay=1.0, covered=covered
    )
    counts = counts + StepCounts.from_stacked(c.stacked().cpu())
    replay = replay + replay_counts(
        steps,
        target,
        loss_mask=batch["loss_mask"],
        segment_ids=batch["segment_ids"],
        num_draft_tokens=num_draft_tokens,
        max_answer_tokens=max_answer_tokens,
        first_span_only=first_span_only,
        covered=covered,
    )
    return counts, replay


def figures(counts: StepCounts, replay: torch.Tensor, num_draft_tokens: int, samples: int) -> dict[str, float]:
    acc = counts.acc_full()
    out = {"samples": float(samples), f"sim_accept_len_k{num_draft_tokens}": 1.0 + float(acc.sum())}
    out.update({f"acc_k{k}": float(a) for k, a in enumerate(acc)})
    out.update(replay_metrics(replay, prefix=""))
    return out


def replay_device(target: str, what: str) -> tuple[str | None, str | None]:
    """(device, None) where a replay needing the target's forward/weights can run here, else
    (None, why not): a target over the fp32 reference limit needs a GPU."""
    from eagle3.evaluation.diagnostics.mismatch import MAX_REFERENCE_BYTES, weights_bytes

    if torch.cuda.is_available():
        return "cuda", None
    size = weights_bytes(target)
    if size > MAX_REFERENCE_BYTES:
        return None, f"{what} skipped: the target ({size / 2**30:.1f} GiB) is too large for a CPU replay"
    return "cpu", None


def replay_for_prompts(
    export_dir: str | Path,
    target: str,
    dataset_dir: str | Path | None,
    sample_ids: list[str],
    *,
    num_draft_tokens: int,
    max_answer_tokens: int,
) -> tuple[dict | None, str | None]:
    """evaluate's train-side figure for the val prompts vLLM just served: (figures, None), or
    (None, why it was skipped). Each sample's first answer only (the prompt is its opening
    turn); on a regenerated greedy dataset this is what vLLM's counters should reproduce."""
    if dataset_dir is None or not sample_ids:
        return None, None
    if not shards_on_disk(dataset_dir):
        return None, f"train-side replay skipped: {dataset_dir} has no shards here (manifest only)"
    device, note = replay_device(target, "train-side replay")
    if device is None:
        return None, f"{note}; run python -m eagle3.stages.replay_export export_dir=... dataset_dir=... on a GPU"
    head, _ = load_exported_head(export_dir, target)
    return train_side_figures(
        head,
        str(dataset_dir),
        num_draft_tokens=num_draft_tokens,
        max_answer_tokens=max_answer_tokens,
        sample_ids=sample_ids,
        first_span_only=True,
        device=device,
    ), None
