"""Round-structured replay (eagle3/draft/replay.py): rounds start where the last one ended."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft.loss import eagle3_loss
from eagle3.draft.replay import chain_lengths, replay_counts, replay_metrics, replay_rounds


def _one_answer(prompt: int, answer: int):
    """loss_mask/segment_ids [1, T] for one sample: `prompt` tokens, then `answer` answer tokens."""
    mask = torch.tensor([[False] * prompt + [True] * answer])
    return mask, torch.zeros_like(mask, dtype=torch.int64)


def _logits_from(argmax: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(argmax, vocab).float() * 10.0


def test_rounds_follow_the_previous_round_not_every_position():
    # every position 0..9 may start a round; the uniform estimate averages the chain over all
    # of them (0.5 accepted -> 1.5 for both chains below), serving walks rounds instead
    ok = torch.ones(1, 10, dtype=torch.bool)
    even = replay_rounds(torch.tensor([[1, 0] * 5]), ok, num_draft_tokens=1)
    # the span's first position (t=0) is the prefill's token, so rounds begin at t=1:
    # t=1 rejects -> t=2 accepts -> t=4 -> t=6 -> t=8 -> t=10 ends: 5 rounds, 4 accepted
    assert even.tolist() == [5, 4, 4]
    assert replay_metrics(even)["val/replay_accept_len"] == pytest.approx(1.8)
    odd = replay_rounds(torch.tensor([[0, 1] * 5]), ok, num_draft_tokens=1)
    assert odd.tolist() == [5, 5, 5]  # t = 1, 3, 5, 7, 9 each accept 1
    assert replay_metrics(odd)["val/replay_accept_len"] == pytest.approx(2.0)
    none = replay_rounds(torch.zeros(1, 10, dtype=torch.int64), ok, num_draft_tokens=1)
    assert none.tolist() == [9, 0, 0]


def test_spans_restart_and_answer_length_caps_rounds():
    chain = torch.tensor([[3, 3, 3, 3, 3, 3, 0, 3, 3, 3, 3, 3]])
    ok = torch.tensor([[True] * 6 + [False] + [True] * 5])
    counts = replay_rounds(chain, ok, num_draft_tokens=3)
    # span 1 (t=0..5): rounds at t=1 (a=3) -> t=5 (a=3) -> done; span 2 (t=7..11): t=8 (3) -> t=12 stop
    assert counts.tolist() == [3, 9, 3, 3, 3]
    # only rounds whose first drafted token is among the first 4 answer tokens (t + 2 - f < 4)
    capped = replay_rounds(chain, ok, num_draft_tokens=3, max_answer_tokens=4)
    assert capped.tolist() == [2, 6, 2, 2, 2]


def test_perfect_and_useless_heads_through_the_real_counts():
    torch.manual_seed(0)
    vocab, steps = 11, 3
    mask, seg = _one_answer(prompt=4, answer=20)
    target_logits = torch.randn(1, mask.shape[1], vocab)
    tgt = target_logits.argmax(-1)
    # perfect: step k at t predicts the target's argmax at t+1+k
    perfect = []
    for k in range(steps):
        shifted = torch.roll(tgt, shifts=-(1 + k), dims=1)
        perfect.append(_logits_from(shifted, vocab))
    counts = replay_counts(perfect, target_logits, loss_mask=mask, segment_ids=seg, num_draft_tokens=3)
    m = replay_metrics(counts)
    # the answer is x_4..x_23; rounds start at t=3 and accept 3 each until the answer runs out
    assert m["val/replay_acc_pos0"] == pytest.approx(1.0)
    assert 3.0 < m["val/replay_accept_len"] <= 4.0
    useless = [
        _logits_from((shifted_t + 1) % vocab, vocab)
        for shifted_t in (torch.roll(tgt, shifts=-(1 + k), dims=1) for k in range(steps))
    ]
    counts_u = replay_counts(useless, target_logits, loss_mask=mask, segment_ids=seg, num_draft_tokens=3)
    assert replay_metrics(counts_u)["val/replay_accept_len"] == pytest.approx(1.0)
    # the uniform estimate and the replay agree at both extremes (only the round structure differs)
    _, sc = eagle3_loss(useless, target_logits, loss_mask=mask, segment_ids=seg, step_decay=1.0)
    assert float(sc.acc_full().sum()) == pytest.approx(0.0)


def test_chain_stops_at_the_first_wrong_step_and_at_the_answer_end():
    vocab = 5
    tgt = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    target_logits = _logits_from(tgt, vocab)
    mask, seg = _one_answer(prompt=2, answer=6)
    good = [_logits_from(torch.roll(tgt, -(1 + k), 1), vocab) for k in range(3)]
    bad_step1 = [good[0], _logits_from((torch.roll(tgt, -2, 1) + 1) % vocab, vocab), good[2]]
    from eagle3.draft.loss import step_positions

    pos = step_positions(mask, seg, 3)
    chain = chain_lengths(good, tgt, pos, 3)[0].tolist()
    # t drafts x_{t+2..t+4}; the sample ends at x_7: t=5 has 1 step left, t=4 two, t<=3 three
    assert chain[:6] == [3, 3, 3, 3, 2, 1]
    assert chain_lengths(bad_step1, tgt, pos, 3)[0].tolist()[:6] == [1, 1, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="num_draft_tokens must be in 1..3"):
        replay_counts(good, target_logits, loss_mask=mask, segment_ids=seg, num_draft_tokens=4)


def test_first_span_only_keeps_each_samples_opening_answer():
    # two packed samples; sample 0 has two answer spans, sample 1 one
    chain = torch.tensor([[1] * 14])
    ok = torch.tensor([[True, True, True, False, False, True, True, True, False, False, True, True, True, False]])
    seg = torch.tensor([[0] * 10 + [1] * 4])
    every = replay_rounds(chain, ok, num_draft_tokens=1, segment_ids=seg)
    first = replay_rounds(chain, ok, num_draft_tokens=1, segment_ids=seg, first_span_only=True)
    # each span of 3 starts at its 2nd position and accepts 1: one round per span
    assert every.tolist() == [3, 3, 3] and first.tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="needs segment_ids"):
        replay_rounds(chain, ok, num_draft_tokens=1, first_span_only=True)
