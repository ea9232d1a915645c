"""The teacher's logits on the draft vocab from either kind of batch: the target's final state,
or the target's top-k next tokens stored in its place.

A batch carries the teacher one of two ways (after the data module's on_after_batch_transfer):
  final_hidden      [B, T, H]  the target's last state z_t; the head's frozen target_norm and
                               target_lm_head rows of the draft vocab give its logits
  teacher_ids       [B, T, k]  int64 target-vocab ids of the k most probable next tokens
  teacher_logprobs  [B, T, k]  their log-probabilities (log_softmax over the full target vocab);
                               padding positions hold ids 0 and logprobs 0.0
From the top-k the draft-vocab row is: each top-k id that lies in the draft vocab at its
logprob, every other draft entry at ABSENT_LOGIT. Its softmax is the teacher renormalised over
(top-k ∩ draft vocab): what the final state's logits give when k covers the draft vocab.

A position none of whose top-k ids lies in the draft vocab (the teacher's mass sits outside it)
has no usable target: its row is uniform (all ABSENT_LOGIT, finite) and `covered` is False
there. The loss leaves such rows out (eagle3_loss's `covered`) rather than train the draft
towards a uniform row: the final state would teach the renormalised tail, which the top-k does
not hold, so no target is more honest than a made-up one. Accuracy and the replay count the
position as a miss: the target's greedy token is then outside the draft vocab, so serving
rejects whatever the draft proposes there. bench/storage_formats.py --topk counts how often
it happens.
"""

from __future__ import annotations

import torch

TOPK_KEYS = ("teacher_ids", "teacher_logprobs")
FINAL_KEY = "final_hidden"
# the logit of a draft entry outside the top-k: finite, since the loss computes p * log p and
# 0 * -inf is NaN; far enough below any logprob (>= -log(Vt) for the top-1, rarely below -100
# for the k-th) that its softmax is exactly 0 in fp32 (exp underflows below about -104)
ABSENT_LOGIT = -1.0e4


class TeacherBatchError(KeyError):
    pass


def target_to_draft_index(d2t: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    """d2t [V] (target_id = draft_id + d2t[draft_id]) -> [Vt] int64: the draft id of each target
    id, -1 where the target id is not in the draft vocab."""
    v = d2t.shape[0]
    draft_ids = torch.arange(v, dtype=torch.int64, device=d2t.device)  # [V]
    index = torch.full((target_vocab_size,), -1, dtype=torch.int64, device=d2t.device)  # [Vt]
    index[draft_ids + d2t.to(torch.int64)] = draft_ids
    return index


def topk_target_logits(
    teacher_ids: torch.Tensor,  # [B, T, k] int64 target-vocab ids
    teacher_logprobs: torch.Tensor,  # [B, T, k] log-probabilities over the full target vocab
    target_to_draft: torch.Tensor,  # [Vt] int64 from target_to_draft_index
    draft_vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, T, V] fp32, covered [B, T] bool): the teacher on the draft vocab (see the
    module doc) and whether any of a position's top-k ids lies in the draft vocab."""
    if teacher_ids.shape != teacher_logprobs.shape or teacher_ids.dim() != 3:
        raise ValueError(
            f"teacher_ids {tuple(teacher_ids.shape)} and teacher_logprobs {tuple(teacher_logprobs.shape)}: "
            "expected the same shape [B, T, k]"
        )
    draft = target_to_draft[teacher_ids]  # [B, T, k] draft ids, -1 outside the draft vocab
    present = draft >= 0  # [B, T, k]
    # clamped: a -inf logprob (a token the target never emits) stays finite like the absent ones
    values = teacher_logprobs.float().clamp_min(ABSENT_LOGIT)  # [B, T, k]
    # an absent id writes ABSENT_LOGIT into column 0 under amax, which never lowers a real entry;
    # amax also makes duplicate ids (the padding's zeros) order-independent
    values = torch.where(present, values, torch.full_like(values, ABSENT_LOGIT))  # [B, T, k]
    columns = draft.clamp_min(0)  # [B, T, k]
    b, t, _ = teacher_ids.shape
    logits = torch.full((b, t, draft_vocab_size), ABSENT_LOGIT, dtype=torch.float32, device=values.device)
    logits.scatter_reduce_(-1, columns, values, reduce="amax", include_self=True)  # [B, T, V]
    return logits, present.any(-1)  # [B, T, V], [B, T]


def teacher_kind(batch: dict[str, torch.Tensor]) -> str:
    """The batch's teacher, "final" or "topk", by its keys; a clear error when it holds neither."""
    if FINAL_KEY in batch:
        return "final"
    if all(key in batch for key in TOPK_KEYS):
        return "topk"
    raise TeacherBatchError(
        f"batch: expected {FINAL_KEY!r} or both of {TOPK_KEYS}, got keys {sorted(batch)} "
        "(the dataset holds neither the target's final state nor its top-k)"
    )
