"""EAGLE-3 TTT loss and per-step counts (summed across ranks, never averaged as means).

Which positions count (head.py has the index convention): step k at position t predicts
x_{t+2+k} against p_{t+1+k}.

- loss at step k counts t when x_{t+2+k} exists in t's sample and loss_mask[t+2+k]
  (the predicted token is an assistant token). Padding and the next packed sample never
  count.
- accuracy at step k counts t when steps 0 and k both count: the draft chain starts by
  predicting an assistant token and step k's token is one too (for a contiguous assistant
  span: x_{t+2} .. x_{t+2+k} are all assistant tokens). The numerator (correct_full)
  equals speculators' full_acc sum (its prev_correct is seeded with the step-0 mask);
  speculators divides by every loss position, so its acc_k is lower wherever a chain could
  start on a prompt token.

loss = sum_k step_decay^k * (sum over counted t of loss_k(t)) / (number counted at k)  (step_weighted)
with loss_k(t) a divergence over the draft vocab between p (the target softmax on the draft
rows) and q (the draft's softmax), by kind (speculators 0.9's name in brackets; each equals
its eager implementation, tests/unit/draft/test_draft_parity.py):
  "forward_kl"  KL(p || q) = sum p (log p - log q)                        [kl_div]
  "reverse_kl"  KL(q || p) = sum q (log q - log p): mode-seeking          [rkl]
  "jsd"         (KL(p || m) + KL(q || m)) / 2, m = (p + q) / 2; <= log 2  [jsd]
  "tv"          1 - sum min(p, q): one minus the acceptance rate of
                speculative sampling with draft q and target p            [tv]
  "ce_argmax"   cross-entropy of q against argmax p                       [ce]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from eagle3.draft.shift import shift_left

LOSS_KINDS = ("forward_kl", "ce_argmax", "reverse_kl", "jsd", "tv")


@dataclass
class StepCounts:
    """Per-step sums, each a float tensor [K] (K = TTT steps), all-reducible with SUM.

    loss_sum[k]     sum of step k's per-position loss over counted positions (detached)
    loss_count[k]   positions counted in step k's loss
    acc_count[k]    positions counted in step k's accuracy (steps 0 and k both count)
    correct_full[k] of those, steps 0..k all argmax-equal to the target's argmax
    cond_count[k]   of those, steps 0..k-1 all correct (the denominator of cond_acc_k)
    """

    loss_sum: torch.Tensor
    loss_count: torch.Tensor
    acc_count: torch.Tensor
    correct_full: torch.Tensor
    cond_count: torch.Tensor

    @property
    def num_steps(self) -> int:
        return int(self.loss_sum.shape[0])

    def stacked(self) -> torch.Tensor:
        """[5, K] float64 tensor for one all_reduce(SUM); `from_stacked` undoes it."""
        return torch.stack([getattr(self, f.name).double() for f in fields(self)])

    @classmethod
    def from_stacked(cls, stacked: torch.Tensor) -> StepCounts:
        return cls(*[row for row in stacked])

    @classmethod
    def zeros(cls, num_steps: int, device: torch.device | str | None = None) -> StepCounts:
        return cls(*[torch.zeros(num_steps, dtype=torch.float64, device=device) for _ in fields(cls)])

    def __add__(self, other: StepCounts) -> StepCounts:
        return StepCounts(*[getattr(self, f.name) + getattr(other, f.name) for f in fields(self)])

    def loss_mean(self) -> torch.Tensor:
        return self.loss_sum / self.loss_count.clamp_min(1)

    def acc_full(self) -> torch.Tensor:
        return self.correct_full / self.acc_count.clamp_min(1)

    def acc_cond(self) -> torch.Tensor:
        return self.correct_full / self.cond_count.clamp_min(1)

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat floats for a logger: loss_k, acc_k, cond_acc_k, sim_accept_len."""
        out: dict[str, float] = {}
        for k, (loss, acc, cond) in enumerate(zip(self.loss_mean(), self.acc_full(), self.acc_cond())):
            out[f"{prefix}loss_{k}"] = float(loss)
            out[f"{prefix}acc_{k}"] = float(acc)
            out[f"{prefix}cond_acc_{k}"] = float(cond)
        out[f"{prefix}sim_accept_len"] = sim_accept_len(self)
        return out


def step_weighted(step_losses: Sequence[torch.Tensor], step_decay: float) -> torch.Tensor:
    """The TTT loss from per-step mean losses: sum_k step_decay^k * step_losses[k]. One
    weighting over steps for training (means with grad, over train.loss_tokens' positions) and
    validation (means of the summed counts, over the answers)."""
    if not step_losses:
        raise ValueError("step_weighted: no steps")
    total = step_losses[0]  # step_decay^0 = 1
    for k in range(1, len(step_losses)):
        total = total + (step_decay**k) * step_losses[k]
    return total


def sim_accept_len(counts: StepCounts) -> float:
    """Simulated acceptance length 1 + sum_k acc_k (acc_k "full": steps 0..k all correct).

    A uniform per-position estimate: it overstates what vLLM measures (docs/architecture.md).
    """
    return float(1.0 + counts.acc_full().sum())


def step_positions(loss_mask: torch.Tensor, segment_ids: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
    """Per step k: bool [B, T], True where x_{t+2+k} exists in t's sample and is loss-masked."""
    out = []
    for step in range(num_steps):
        shifted, valid = shift_left(loss_mask.to(torch.bool), segment_ids, 2 + step, fill=False)
        out.append(shifted & valid)
    return out


@dataclass
class TargetStats:
    """What the loss needs from the target logits, computed once for all steps (no grad).
    Each field is filled only for the kinds that read it ([0]-sized otherwise)."""

    probs: torch.Tensor  # [B, T, V] fp32 p: forward_kl, jsd, tv
    log_probs: torch.Tensor  # [B, T, V] fp32 log p: reverse_kl, jsd
    neg_entropy: torch.Tensor  # [B, T]: sum_v p log p (forward_kl)
    argmax: torch.Tensor  # [B, T] int64

    @classmethod
    @torch.no_grad()
    def from_logits(cls, target_logits: torch.Tensor, kind: str | tuple[str, ...]) -> TargetStats:
        """The fields one loss kind reads, or several kinds' (the on-policy objective reads two)."""
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        argmax = target_logits.argmax(-1)
        empty = target_logits.new_zeros(0)
        if all(k == "ce_argmax" for k in kinds):
            return cls(empty, empty, empty, argmax)
        logp = F.log_softmax(target_logits.float(), dim=-1)
        probs = logp.exp() if any(k in ("forward_kl", "jsd", "tv") for k in kinds) else empty
        neg_entropy = (probs * logp).sum(-1) if "forward_kl" in kinds else empty
        return cls(probs, logp if any(k in ("reverse_kl", "jsd") for k in kinds) else empty, neg_entropy, argmax)


def per_position_loss(draft_logits: torch.Tensor, target: TargetStats, offset: int, kind: str) -> torch.Tensor:
    """Loss of draft_logits [B, n, V] against target rows offset .. offset+n-1, as [B, n] fp32.

    forward_kl is written as lse(q_logits) - p . q_logits + sum p log p, so no [B, n, V]
    log-softmax of the draft is materialised per step (memory: T=4096 x V=32000 fp32 is
    0.5 GB per tensor); the other divergences need log q (and q) of the draft, so each
    holds a few such tensors per step (jsd the most: log q, q and log m).
    """
    n = draft_logits.shape[1]
    logits = draft_logits.float()
    rows = slice(offset, offset + n)
    if kind == "ce_argmax":
        return torch.logsumexp(logits, dim=-1) - logits.gather(-1, target.argmax[:, rows, None]).squeeze(-1)
    if kind == "forward_kl":
        p = target.probs[:, rows]
        return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1) + target.neg_entropy[:, rows]
    logq = F.log_softmax(logits, dim=-1)
    if kind == "reverse_kl":
        return (logq.exp() * (logq - target.log_probs[:, rows])).sum(-1)
    if kind == "jsd":
        logp, p, q = target.log_probs[:, rows], target.probs[:, rows], logq.exp()
        log_m = torch.logaddexp(logq, logp) - math.log(2.0)
        return 0.5 * ((p * (logp - log_m)).sum(-1) + (q * (logq - log_m)).sum(-1))
    if kind == "tv":
        return 1.0 - torch.minimum(logq.exp(), target.probs[:, rows]).sum(-1)
    raise ValueError(f"eagle3_loss: kind must be one of {LOSS_KINDS}, got {kind!r}")


def eagle3_loss(
    step_logits: list[torch.Tensor],  # per TTT step: draft logits [B, T, V]
    target_logits: torch.Tensor,  # [B, T, V] from z_t (head.target_logits), unshifted
    *,
    loss_mask: torch.Tensor,  # [B, T] bool: x_t is a trained (assistant) token
    segment_ids: torch.Tensor,  # [B, T] int, -1 = padding
    step_decay: float,
    kind: str = "forward_kl",
    covered: torch.Tensor | None = None,  # [B, T] bool: target row t is usable (teacher.py)
) -> tuple[torch.Tensor, StepCounts]:
    """(scalar loss with grad, StepCounts); see the module doc for what counts.

    covered (a top-k teacher, eagle3/draft/teacher.py): a position whose target row is not
    covered leaves the loss and counts as a miss in the accuracy (its greedy token lies outside
    the draft vocab). None: every row is usable (a final-state teacher)."""
    kind = getattr(kind, "value", kind)  # accepts the config's LossKind enum as well
    if kind not in LOSS_KINDS:
        raise ValueError(f"eagle3_loss: kind must be one of {LOSS_KINDS}, got {kind!r}")
    num_steps = len(step_logits)
    if num_steps < 1:
        raise ValueError("eagle3_loss: step_logits is empty")
    if target_logits.shape != step_logits[0].shape:
        raise ValueError(
            f"eagle3_loss: target_logits shape {tuple(target_logits.shape)} != draft logits shape "
            f"{tuple(step_logits[0].shape)} (both [B, T, draft_vocab])"
        )
    positions = step_positions(loss_mask, segment_ids, num_steps)
    target = TargetStats.from_logits(target_logits, kind)
    t = target_logits.shape[1]
    device = target_logits.device
    step_means = []
    sums = {
        name: torch.zeros(num_steps, dtype=torch.float64, device=device)
        for name in ("loss_sum", "loss_count", "acc_count", "correct_full", "cond_count")
    }
    judged = target.argmax if covered is None else torch.where(covered, target.argmax, -1)  # [B, T]: -1 never matches
    all_correct_so_far = torch.ones_like(positions[0])
    for step, logits in enumerate(step_logits):
        # step k at t is scored against p_{t+1+k}: the target row 1+k later. Rows t >= T-1-k
        # have no target in this row at all; positions[step] is False there (and wherever
        # t+1+k falls in another sample), so plain slices suffice.
        offset = 1 + step
        n = t - offset
        counted = positions[step]
        in_loss = counted
        if covered is not None:  # [B, T]: the row t+1+k that t is scored against is usable
            in_loss = counted.clone()
            in_loss[:, :n] &= covered[:, offset:]
        if n > 0:
            per_pos = per_position_loss(logits[:, :n], target, offset, kind)
            step_loss_sum = torch.where(in_loss[:, :n], per_pos, torch.zeros_like(per_pos)).sum()
            correct = torch.zeros_like(counted)
            correct[:, :n] = logits[:, :n].detach().argmax(-1) == judged[:, offset:]
        else:
            step_loss_sum = logits.sum() * 0.0  # keeps the graph connected for an empty step
            correct = torch.zeros_like(counted)
        count = in_loss.sum()
        step_means.append(step_loss_sum / count.clamp_min(1))

        scored = positions[0] & counted
        sums["loss_sum"][step] = step_loss_sum.detach()
        sums["loss_count"][step] = count
        sums["acc_count"][step] = scored.sum()
        sums["cond_count"][step] = (scored & all_correct_so_far).sum()
        all_correct_so_far = all_correct_so_far & correct
        sums["correct_full"][step] = (scored & all_correct_so_far).sum()
    return step_weighted(step_means, step_decay), StepCounts(**sums)
