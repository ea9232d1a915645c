"""The choice of k for a top-k teacher stored in place of the final state, on real states.

Per k, against the full teacher on the draft vocab (head.target_logits from the exact final
state: the target's norm + lm_head rows of the draft vocab), the teacher that training builds
from the stored top-k (head.teacher_logits on teacher_ids / teacher_logprobs, the top-k of
log_softmax over the full target vocab, logprobs rounded to fp16 as 6 bytes a slot store them:
int32 id + fp16 logprob):
  kl            KL(p_topk || p_full) in nats per token, over positions with a covered row (the
                other direction is infinite: p_topk is 0 outside the top-k)
  tv            total variation 1/2 sum |p_full - p_topk| over the draft vocab
  top1          the argmax on the draft vocab agrees (an uncovered row counts as a disagreement)
  mass          the mean probability mass of the full target distribution the top-k hold
  draft_mass    the mean share of p_full's mass on the draft vocab that the top-k hold
  uncovered     the fraction of positions whose top-k hold no draft token (left out of the loss)
Used by bench/storage_formats.py --topk.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from eagle3.data.vocab import build_draft_vocab
from eagle3.draft.config import DraftConfig
from eagle3.draft.head import Eagle3DraftHead
from eagle3.store import HiddenStateDataset
from eagle3.target_model.resolve import load_target_head_weights, read_hf_config

BYTES_PER_SLOT = 6  # int32 target id + fp16 logprob


def teacher_head(
    target_dir: str, src: HiddenStateDataset, draft_vocab_size: int
) -> tuple[Eagle3DraftHead, torch.Tensor]:
    """(a head holding the target's frozen parts and the dataset's draft vocab, the full lm_head
    [Vt, H] fp32). The vocab file of that size when the dataset has one, else built from its
    token counts as extract.py builds it."""
    weights = load_target_head_weights(target_dir)
    cfg = DraftConfig.from_target_config(read_hf_config(target_dir), draft_vocab_size=draft_vocab_size)
    if draft_vocab_size in src.vocab_sizes:
        d2t, t2d = src.load_vocab(draft_vocab_size)
    else:
        d2t, t2d = build_draft_vocab(src.token_freq(), draft_vocab_size)
    head = Eagle3DraftHead(cfg)
    full = weights["lm_head"].float()  # [Vt, H]
    head.load_target_weights(weights["embed"].float(), weights["norm"].float(), full, d2t, t2d, False)
    return head.eval(), full


@torch.no_grad()
def topk_check(
    src: HiddenStateDataset, target_dir: str, limit: int, ks: list[int], draft_vocab_size: int
) -> dict[str, dict[str, float]]:
    """{str(k): {kl, tv, top1, mass, draft_mass, uncovered}} over the first ``limit`` samples."""
    head, full = teacher_head(target_dir, src, draft_vocab_size)
    sums = {k: {"kl": 0.0, "tv": 0.0, "top1": 0.0, "mass": 0.0, "draft_mass": 0.0, "uncovered": 0.0} for k in ks}
    tokens = 0
    for i in range(limit):
        z = src[i]["hidden"][None, :, -1].float()  # [1, T, H]: the exact final state
        p_logits = head.target_logits(z)  # [1, T, V]
        logp = F.log_softmax(p_logits, -1)  # [1, T, V]
        full_logp = F.log_softmax(F.linear(head.target_norm(z), full), -1)  # [1, T, Vt]
        in_draft = head.t2d[None, None]  # [1, 1, Vt]
        for k in ks:
            top = full_logp.topk(k, dim=-1)  # [1, T, k]
            stored = top.values.half().float()  # [1, T, k]: what the shard keeps
            batch = {"teacher_ids": top.indices, "teacher_logprobs": stored}
            q_logits, covered = head.teacher_logits(batch)  # [1, T, V], [1, T]
            assert covered is not None
            logq = F.log_softmax(q_logits, -1)  # [1, T, V]
            q = logq.exp()  # [1, T, V]: exactly 0 outside the top-k (ABSENT_LOGIT underflows)
            # KL(p_topk || p_full): KL(p_full || p_topk) is infinite wherever p_full has mass
            # outside the top-k (the stored teacher gives it none), so the finite direction is
            # reported; for exact logprobs it is -log(the draft-vocab mass held)
            kl = torch.where(q > 0, q * (logq - logp), torch.zeros_like(q)).sum(-1)  # [1, T]
            s = sums[k]
            s["kl"] += float(kl[covered].sum())
            s["tv"] += float((0.5 * (q - logp.exp()).abs().sum(-1))[covered].sum())
            s["uncovered"] += float((~covered).sum())
            s["top1"] += float(((p_logits.argmax(-1) == q_logits.argmax(-1)) & covered).sum())
            s["mass"] += float(top.values.exp().sum())
            held = torch.zeros_like(full_logp, dtype=torch.bool).scatter_(-1, top.indices, True) & in_draft
            on_draft = (full_logp.exp() * in_draft).sum(-1)  # [1, T]: p_full's mass on the draft vocab
            s["draft_mass"] += float(((full_logp.exp() * held).sum(-1) / on_draft.clamp_min(1e-30)).sum())
        tokens += int(z.shape[1])
    out: dict[str, dict[str, float]] = {}
    for k, s in sums.items():
        covered_tokens = max(tokens - s["uncovered"], 1.0)
        out[str(k)] = {
            "kl_per_token": s["kl"] / covered_tokens,
            "tv_per_token": s["tv"] / covered_tokens,
            "top1_agreement": s["top1"] / tokens,
            "mass": s["mass"] / tokens,
            "draft_mass": s["draft_mass"] / tokens,
            "uncovered": s["uncovered"] / tokens,
            "tokens": float(tokens),
        }
    return out


def topk_bytes(formats: dict[str, dict[str, float]], final_bytes: float, k: int) -> dict[str, float]:
    """Bytes per token of the shards with the final state replaced by k slots, per aux format
    (each format's measured bytes per token less the exact final state's)."""
    return {
        storage: row["bytes_per_token"] - final_bytes + k * BYTES_PER_SLOT
        for storage, row in formats.items()
        if storage != "exact"
    }


def dataset_vocab(directory: Path) -> int:
    """The dataset's draft vocab size (the smallest it holds): the one the bench measures by default."""
    sizes = HiddenStateDataset(directory).vocab_sizes
    if not sizes:
        raise SystemExit(f"{directory}: no draft vocab file (vocab-<V>.safetensors); pass --draft-vocab")
    return sizes[0]
