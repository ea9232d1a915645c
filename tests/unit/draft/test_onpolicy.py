"""The on-policy objective (eagle3/draft/onpolicy.py) on a case small enough to follow by hand."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft.onpolicy import mixed_loss, onpolicy_cells, onpolicy_loss

VOCAB, K, DECAY = 4, 2, 0.5
# one sample of 10 tokens: 2 prompt tokens, then 8 answer tokens x_2 .. x_9
ANSWERS = torch.tensor([[False, False] + [True] * 8])
SEGMENTS = torch.zeros(1, 10, dtype=torch.int64)
TARGET_ARGMAX = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]])  # argmax of p_r, r = 0 .. 9
# step k at t is right when it proposes argmax p_{t+1+k}. Step 0 is right at t = 1, 5, 7; step 1
# at t = 1 only. Step 0 drafts x_{t+2}: t = 0 .. 7 (answer tokens x_2 .. x_9); step 1 t = 0 .. 6.
STEP0_RIGHT = {1, 5, 7}
STEP1_RIGHT = {1}
# serving's rounds: the answer's first token x_2 is the prefill's, so the first round is at t = 1:
#   t=1 accepts both steps (chain 2) -> t=4 rejects step 0 (chain 0) -> t=5 accepts step 0,
#   rejects step 1 (chain 1) -> t=7 accepts step 0; its step 1 would draft x_10, past the answer:
#   the chain ends there without a rejection -> t=9 lies past the span: done
ROUNDS = [(1, 2), (4, 0), (5, 1), (7, 1)]
ACCEPTED = {0: [1, 5, 7], 1: [1]}  # (step -> positions) forward KL
REJECTED = {0: [4], 1: [5]}  # decay^k x reverse KL
# every answer position as a start: the positions serving never starts a round at (0, 2, 3, 6)
# are rejected at step 0 (their step 0 is wrong)
REJECTED_EVERYWHERE = {0: [0, 2, 3, 4, 6], 1: [5]}


def _case(seed: int = 0):
    """(draft step logits, target logits): random rows whose argmax is the one the case needs."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(1, 10, VOCAB, generator=g)
    target.scatter_(-1, TARGET_ARGMAX[..., None], 4.0)
    steps = []
    for k, right in enumerate((STEP0_RIGHT, STEP1_RIGHT)):
        wanted = torch.tensor([[int(TARGET_ARGMAX[0, min(t + 1 + k, 9)]) for t in range(10)]])
        wanted = torch.where(torch.tensor([[t in right for t in range(10)]]), wanted, (wanted + 1) % VOCAB)
        logits = torch.randn(1, 10, VOCAB, generator=g)
        logits.scatter_(-1, wanted[..., None], 4.0)
        steps.append(logits.requires_grad_())
    return steps, target


def _as_positions(cells: list[torch.Tensor]) -> dict[int, list[int]]:
    return {k: c[0].nonzero().squeeze(1).tolist() for k, c in enumerate(cells) if c.any()}


def _by_hand(steps, target, accepted, rejected) -> float:
    """sum of KL(p || q) over the accepted cells and DECAY^k KL(q || p) over the rejected ones, per cell."""
    total, cells = 0.0, 0
    for k in range(K):
        for t in accepted.get(k, []) + rejected.get(k, []):
            p = torch.softmax(target[0, t + 1 + k].double(), -1)
            q = torch.softmax(steps[k][0, t].detach().double(), -1)
            if t in accepted.get(k, []):
                total += float((p * (p.log() - q.log())).sum())
            else:
                total += DECAY**k * float((q * (q.log() - p.log())).sum())
            cells += 1
    return total / cells


def test_the_cells_are_the_current_heads_rounds():
    steps, target = _case()
    cells = onpolicy_cells(steps, TARGET_ARGMAX, loss_mask=ANSWERS, segment_ids=SEGMENTS, num_draft_tokens=K)
    assert _as_positions(cells.accepted) == ACCEPTED
    assert _as_positions(cells.rejected) == REJECTED
    # 4 rounds, 4 accepted tokens; 3 rounds accept position 0, one accepts position 1
    assert cells.counts.tolist() == [len(ROUNDS), sum(a for _, a in ROUNDS), 3, 1]


def test_every_position_as_a_start_rejects_where_serving_never_drafts():
    steps, target = _case()
    cells = onpolicy_cells(
        steps, TARGET_ARGMAX, loss_mask=ANSWERS, segment_ids=SEGMENTS, num_draft_tokens=K, round_starts_only=False
    )
    assert _as_positions(cells.accepted) == ACCEPTED
    assert _as_positions(cells.rejected) == REJECTED_EVERYWHERE
    assert cells.counts.tolist() == [4, 4, 3, 1]  # the rounds' acceptance is serving's either way


@pytest.mark.parametrize("starts_only,rejected", [(True, REJECTED), (False, REJECTED_EVERYWHERE)])
def test_the_loss_is_forward_kl_where_accepted_and_decayed_reverse_kl_at_the_rejection(starts_only, rejected):
    steps, target = _case()
    out = onpolicy_loss(
        steps,
        target,
        loss_mask=ANSWERS,
        segment_ids=SEGMENTS,
        num_draft_tokens=K,
        decay=DECAY,
        round_starts_only=starts_only,
    )
    assert float(out.loss.detach()) == pytest.approx(_by_hand(steps, target, ACCEPTED, rejected), rel=1e-5)
    assert int(out.accepted_cells) == 4 and int(out.rejected_cells) == sum(map(len, rejected.values()))
    out.loss.backward()
    # the gradient reaches exactly the scored cells: no other position or step moves
    for k in range(K):
        touched = steps[k].grad[0].abs().sum(-1).nonzero().squeeze(1).tolist()
        assert touched == sorted(ACCEPTED.get(k, []) + rejected.get(k, []))


def test_a_rejection_on_a_row_without_a_usable_target_leaves_the_loss():
    steps, target = _case()
    covered = torch.ones(1, 10, dtype=torch.bool)
    covered[0, 7] = False  # the row step 1 at t=5 (rejected there) is scored against
    out = onpolicy_loss(
        steps, target, loss_mask=ANSWERS, segment_ids=SEGMENTS, num_draft_tokens=K, decay=DECAY, covered=covered
    )
    assert int(out.rejected_cells) == 1
    assert float(out.loss.detach()) == pytest.approx(_by_hand(steps, target, ACCEPTED, {0: [4]}), rel=1e-5)


def test_the_metrics_are_the_rounds_acceptance():
    steps, target = _case()
    out = onpolicy_loss(steps, target, loss_mask=ANSWERS, segment_ids=SEGMENTS, num_draft_tokens=K, decay=DECAY)
    m = out.metrics("train/")
    assert m["train/onpolicy_accept_len"] == pytest.approx(1 + 4 / 4)
    assert m["train/onpolicy_acc_pos0"] == pytest.approx(3 / 4)
    assert m["train/onpolicy_acc_pos1"] == pytest.approx(1 / 4)
    assert m["train/onpolicy_rounds"] == 4


def test_no_answer_gives_a_zero_loss_that_keeps_the_graph():
    steps, target = _case()
    out = onpolicy_loss(
        steps, target, loss_mask=torch.zeros_like(ANSWERS), segment_ids=SEGMENTS, num_draft_tokens=K, decay=DECAY
    )
    assert float(out.loss.detach()) == 0.0 and out.counts.tolist() == [0, 0, 0, 0]
    out.loss.backward()


def test_weight_zero_is_the_supervised_loss_itself_and_the_mix_is_linear():
    supervised, onpolicy = torch.tensor(2.0), torch.tensor(6.0)
    assert mixed_loss(supervised, onpolicy, 0.0) is supervised
    assert mixed_loss(supervised, None, 0.0) is supervised
    assert float(mixed_loss(supervised, onpolicy, 0.25)) == pytest.approx(0.75 * 2.0 + 0.25 * 6.0)
    with pytest.raises(ValueError, match=r"train.onpolicy_weight: expected a value in \[0, 1\], got 1.5"):
        mixed_loss(supervised, onpolicy, 1.5)


def test_a_k_beyond_the_steps_run_is_refused():
    steps, target = _case()
    with pytest.raises(ValueError, match="num_draft_tokens must be in 1..2"):
        onpolicy_loss(steps, target, loss_mask=ANSWERS, segment_ids=SEGMENTS, num_draft_tokens=3, decay=DECAY)
