"""The on-policy objective: the head learns from its own rounds and its own rejections.

Draft-OPD (arXiv 2605.29343) trains a drafter on its own behaviour: forward KL where the draft
agreed with the target, a position-decayed reverse KL where it did not. Served against a greedy
target, an EAGLE-3 chain drafts on the target's own greedy answer up to its first rejection, so
what is the head's own is the round structure: which positions start rounds (right after the
head's rejections) and at which step each round is rejected. Both follow from the current head's
TTT logits on the batch (eagle3/draft/replay.py's chain and walk), so they move with the head
during training, step by step.

Per round at t (replay.round_starts: walk_rounds' rounds as tensors) with chain a = chain[t]
(of num_draft_tokens K):
    steps k < a      accepted: forward KL(p || q) of step k at t (loss.per_position_loss)
    step  k = a < K  the first rejection: decay^a x reverse KL(q || p), where step a still drafts
                     an answer token (a chain also ends where the answer does: no rejection
                     there) and the target row is usable (a top-k teacher's `covered`)
    steps k > a      never drafted in serving: no loss
loss = (sum over accepted cells + sum over rejected cells of their weighted terms) / cells
(cells: accepted + rejected (t, k) pairs; 0 with no cell, the graph kept).
round_starts_only=False takes every answer position as a round start (each position's own
chain, as the uniform estimate does) instead of the walk's starts.

Training mixes it with the supervised loss (loss.eagle3_loss) by a weight w:
(1 - w) x supervised + w x on-policy, and w = 0 returns the supervised loss tensor itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3.draft.loss import TargetStats, per_position_loss, step_positions
from eagle3.draft.replay import chain_lengths, round_starts, start_counts


@dataclass
class OnPolicyCells:
    """Which (t, k) the objective scores, per step k as [B, T] bool, and the rounds' counts."""

    accepted: list[torch.Tensor]  # step k at t was accepted in its round
    rejected: list[torch.Tensor]  # the round at t was rejected at step k
    counts: torch.Tensor  # replay counts of the walked rounds (replay.start_counts), float64, on the device


@dataclass
class OnPolicyLoss:
    loss: torch.Tensor  # scalar with grad
    counts: torch.Tensor  # replay counts of the current head's rounds on this batch
    forward_sum: torch.Tensor  # sum of forward KL over the accepted cells (detached)
    reverse_sum: torch.Tensor  # sum of decay-weighted reverse KL over the rejected cells (detached)
    accepted_cells: torch.Tensor
    rejected_cells: torch.Tensor

    def metric_tensors(self, prefix: str = "train/") -> dict[str, torch.Tensor]:
        """The objective's parts and the rounds' acceptance (1 + accepted / rounds, and the rate
        at each draft position) as 0-dim tensors where they were computed: a trainer logs them
        each step without waiting for the device."""
        counts = self.counts.float()  # [2 + K]
        rounds = counts[0].clamp_min(1.0)
        out = {
            f"{prefix}onpolicy_loss": self.loss.detach().float(),
            f"{prefix}onpolicy_forward_kl": self.forward_sum.float() / self.accepted_cells.clamp_min(1).float(),
            f"{prefix}onpolicy_reverse_kl": self.reverse_sum.float() / self.rejected_cells.clamp_min(1).float(),
            f"{prefix}onpolicy_accept_len": 1.0 + counts[1] / rounds,
            f"{prefix}onpolicy_rounds": counts[0],
        }
        for k in range(counts.shape[0] - 2):
            out[f"{prefix}onpolicy_acc_pos{k}"] = counts[2 + k] / rounds
        return out

    def metrics(self, prefix: str = "train/") -> dict[str, float]:
        """metric_tensors as floats (each a device wait)."""
        return {k: float(v) for k, v in self.metric_tensors(prefix).items()}


@torch.no_grad()
def onpolicy_cells(
    step_logits: list[torch.Tensor],  # per TTT step: draft logits [B, T, V]
    target_argmax: torch.Tensor,  # [B, T]; -1 where the row is not usable (never matches)
    *,
    loss_mask: torch.Tensor,  # [B, T] bool: the answers (serving drafts nothing else)
    segment_ids: torch.Tensor,  # [B, T] int, -1 = padding
    num_draft_tokens: int,
    round_starts_only: bool = True,
) -> OnPolicyCells:
    """The accepted and first-rejected cells of the current head's rounds (the module doc)."""
    k_max = int(num_draft_tokens)
    if k_max < 1 or k_max > len(step_logits):
        raise ValueError(
            f"onpolicy: num_draft_tokens must be in 1..{len(step_logits)} (the TTT steps run), got {num_draft_tokens}"
        )
    positions = step_positions(loss_mask, segment_ids, k_max)
    chain = chain_lengths(step_logits, target_argmax, positions, k_max)  # [B, T]
    # the walk as tensors (replay.round_starts): no host read, so the step can be one compiled graph
    walked = round_starts(chain, positions[0])  # [B, T]
    starts = walked if round_starts_only else positions[0]  # [B, T]
    t = target_argmax.shape[1]
    accepted, rejected = [], []
    for k in range(k_max):
        accepted.append(starts & (chain > k))
        rejected_k = starts & (chain == k) & positions[k]
        offset = 1 + k
        usable = torch.zeros_like(rejected_k)
        usable[:, : max(t - offset, 0)] = target_argmax[:, offset:] >= 0  # the row t+1+k has a target
        rejected.append(rejected_k & usable)
    return OnPolicyCells(accepted, rejected, start_counts(walked, chain, k_max))


def onpolicy_loss(
    step_logits: list[torch.Tensor],  # per TTT step: draft logits [B, T, V]
    target_logits: torch.Tensor,  # [B, T, V] unshifted, as eagle3_loss takes it
    *,
    loss_mask: torch.Tensor,  # [B, T] bool: the answers
    segment_ids: torch.Tensor,
    num_draft_tokens: int,
    decay: float,
    round_starts_only: bool = True,
    covered: torch.Tensor | None = None,  # [B, T] bool: target row t is usable (teacher.py)
) -> OnPolicyLoss:
    """The on-policy objective of one batch (the module doc), with grad through step_logits."""
    if target_logits.shape != step_logits[0].shape:
        raise ValueError(
            f"onpolicy_loss: target_logits shape {tuple(target_logits.shape)} != draft logits shape "
            f"{tuple(step_logits[0].shape)} (both [B, T, draft_vocab])"
        )
    stats = TargetStats.from_logits(target_logits, ("forward_kl", "reverse_kl"))
    judged = stats.argmax if covered is None else torch.where(covered, stats.argmax, -1)
    cells = onpolicy_cells(
        step_logits,
        judged,
        loss_mask=loss_mask,
        segment_ids=segment_ids,
        num_draft_tokens=num_draft_tokens,
        round_starts_only=round_starts_only,
    )
    t = target_logits.shape[1]
    forward_sum = step_logits[0].sum() * 0.0  # keeps the graph connected when no cell counts
    reverse_sum = forward_sum
    for k, (acc, rej) in enumerate(zip(cells.accepted, cells.rejected)):
        offset = 1 + k
        n = t - offset
        if n <= 0:
            continue
        logits = step_logits[k][:, :n]
        fkl = per_position_loss(logits, stats, offset, "forward_kl")  # [B, n]
        rkl = per_position_loss(logits, stats, offset, "reverse_kl")
        forward_sum = forward_sum + torch.where(acc[:, :n], fkl, torch.zeros_like(fkl)).sum()
        reverse_sum = reverse_sum + (decay**k) * torch.where(rej[:, :n], rkl, torch.zeros_like(rkl)).sum()
    accepted_cells = sum(a.sum() for a in cells.accepted)
    rejected_cells = sum(r.sum() for r in cells.rejected)
    total_cells = torch.as_tensor(accepted_cells + rejected_cells, device=target_logits.device)
    loss = (forward_sum + reverse_sum) / total_cells.clamp_min(1)
    return OnPolicyLoss(
        loss=loss,
        counts=cells.counts,
        forward_sum=forward_sum.detach(),
        reverse_sum=reverse_sum.detach(),
        accepted_cells=torch.as_tensor(accepted_cells),
        rejected_cells=torch.as_tensor(rejected_cells),
    )


def mixed_loss(supervised: torch.Tensor, onpolicy: torch.Tensor | None, weight: float) -> torch.Tensor:
    """(1 - weight) x supervised + weight x onpolicy; weight 0 returns `supervised` itself (the
    supervised training, bit for bit)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"train.onpolicy_weight: expected a value in [0, 1], got {weight}")
    if weight == 0.0:
        return supervised
    if onpolicy is None:
        raise ValueError("mixed_loss: onpolicy_weight > 0 needs the on-policy loss")
    return (1.0 - weight) * supervised + weight * onpolicy
