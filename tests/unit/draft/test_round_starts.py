"""replay.round_starts and start_counts, the rounds' walk as tensors: the same rounds and counts as
the host walk (walk_rounds, round_counts), and the on-policy objective read from them unchanged."""

from __future__ import annotations

import pytest
import torch

import eagle3.draft.onpolicy as onpolicy_module
from eagle3.draft.onpolicy import onpolicy_cells, onpolicy_loss
from eagle3.draft.replay import round_counts, round_starts, start_counts, walk_rounds


def _host_starts(chain: torch.Tensor, starts_ok: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: walk_rounds' positions as a mask (what onpolicy_cells built before)."""
    starts = torch.zeros_like(starts_ok, dtype=torch.bool)  # [B, T]
    for b, t, _ in walk_rounds(chain, starts_ok):
        starts[b, t] = True
    return starts


def test_a_case_by_hand():
    # spans: t=1 (length 1: its only token is the prefill's, no round), t=3..4 (length 2: one
    # round at 4), t=6..11 (rounds at 7 (chain 0) -> 8 (chain 2) -> 11 (chain 3) -> 15 past it).
    # The span's first position never starts a round, whatever its chain (3 at t=3, 3 at t=6)
    chain = torch.tensor([[2, 3, 0, 3, 0, 0, 3, 0, 2, 0, 1, 3]])  # [1, 12]
    ok = torch.tensor([[0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)  # [1, 12]
    starts = round_starts(chain, ok)  # [1, 12]
    assert starts[0].nonzero().squeeze(1).tolist() == [4, 7, 8, 11]
    # 4 rounds, 0 + 0 + 2 + 3 accepted; 2 accept position 0, 2 position 1, 1 position 2
    assert start_counts(starts, chain, 3).tolist() == [4, 5, 2, 2, 1]
    assert start_counts(starts, chain, 3).dtype == torch.float64
    # a second row of padding only, and one whose span of length 1 is the row's last position
    pad = torch.zeros(1, 12, dtype=torch.bool)  # [1, 12]
    last = torch.zeros(1, 12, dtype=torch.bool)  # [1, 12]
    last[0, 11] = True
    both = round_starts(chain.expand(3, 12), torch.cat([ok, pad, last]))  # [3, 12]
    assert both[0].equal(starts[0]) and not both[1:].any()


def _random_case(g: torch.Generator, b: int, t: int, k: int, density: float, chains: str):
    """(chain [B, T], starts_ok [B, T]): spans of every length where ok is dense enough, padding
    at the row's end, chains random or all 0 or all K."""
    if chains == "zero":
        chain = torch.zeros(b, t, dtype=torch.int64)  # [B, T]
    elif chains == "full":
        chain = torch.full((b, t), k, dtype=torch.int64)  # [B, T]
    else:
        chain = torch.randint(0, k + 1, (b, t), generator=g)  # [B, T]
    ok = torch.rand(b, t, generator=g) < density  # [B, T]
    pad = torch.randint(0, t // 3 + 1, (b,), generator=g)  # [B] padded tail per row
    ok &= torch.arange(t)[None, :] < (t - pad)[:, None]
    return chain, ok


@pytest.mark.parametrize("chains", ["random", "zero", "full"])
@pytest.mark.parametrize("b,t,k", [(1, 1, 1), (1, 2, 1), (1, 7, 3), (2, 33, 2), (3, 64, 4), (4, 130, 5), (1, 257, 3)])
def test_the_tensor_walk_is_the_host_walk(b, t, k, chains):
    g = torch.Generator().manual_seed(b * 1000 + t * 10 + k)
    spans_of_one_or_two = 0
    for density in (0.2, 0.5, 0.8, 0.95, 1.0):
        for _ in range(8):
            chain, ok = _random_case(g, b, t, k, density, chains)
            starts = round_starts(chain, ok)  # [B, T]
            assert starts.dtype == torch.bool and starts.shape == (b, t)
            assert starts.equal(_host_starts(chain, ok)), (chain, ok)
            expected = round_counts(walk_rounds(chain, ok), k)
            assert start_counts(starts, chain, k).equal(expected)
            # spans of length 1 and 2 occur among the cases (the walk's edge: f = s + 2 > e + 1)
            edges = torch.nn.functional.pad(ok.int(), (1, 1)).diff(dim=1)  # [B, T + 1]
            lengths = edges.eq(-1).nonzero()[:, 1] - edges.eq(1).nonzero()[:, 1]
            spans_of_one_or_two += int((lengths <= 2).sum())
    if t >= 7:
        assert spans_of_one_or_two > 0


def test_a_chain_that_skips_the_span_end_leaves_the_span():
    # the round at t=1 accepts 3: its next round would be at 5, past the span's end at 3 and
    # inside the next span, which starts its own walk at 5 + 1
    chain = torch.tensor([[0, 3, 0, 0, 0, 0, 1, 0, 0]])  # [1, 9]
    ok = torch.tensor([[1, 1, 1, 1, 0, 1, 1, 1, 1]], dtype=torch.bool)  # [1, 9]
    assert round_starts(chain, ok)[0].nonzero().squeeze(1).tolist() == [1, 6, 8]


def test_the_walk_compiles_into_one_graph():
    chain = torch.tensor([[2, 3, 0, 3, 0, 0, 3, 0, 2, 0, 1, 3]])  # [1, 12]
    ok = torch.tensor([[0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)  # [1, 12]
    compiled = torch.compile(round_starts, dynamic=False, fullgraph=True, backend="aot_eager")
    assert compiled(chain, ok).equal(round_starts(chain, ok))


def _onpolicy_case(seed: int, b: int = 2, t: int = 40, vocab: int = 6, steps: int = 3):
    """Random logits that agree often (a few tokens of vocab), answers with gaps, padding."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(b, t, vocab, generator=g) * 3  # [B, T, V]
    step_logits = []
    for k in range(steps):
        # shift the target's rows so that step k at t agrees with p_{t+1+k} where noise allows
        shifted = torch.roll(target, -(1 + k), dims=1) + torch.randn(b, t, vocab, generator=g)  # [B, T, V]
        step_logits.append(shifted.requires_grad_())
    segments = torch.zeros(b, t, dtype=torch.int64)  # [B, T]
    segments[:, t // 2 :] = 1
    segments[-1, -5:] = -1  # padding
    answers = (torch.rand(b, t, generator=g) < 0.8) & (segments >= 0)  # [B, T]
    answers[:, :3] = False  # a prompt
    return step_logits, target, answers, segments


@pytest.mark.parametrize("starts_only", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_onpolicy_cells_and_loss_are_the_host_walks(monkeypatch, seed, starts_only):
    steps, target, answers, segments = _onpolicy_case(seed)
    args = dict(loss_mask=answers, segment_ids=segments, num_draft_tokens=3, round_starts_only=starts_only)
    cells = onpolicy_cells(steps, target.argmax(-1), **args)
    new = onpolicy_loss(steps, target, decay=0.6, **args)
    grads = torch.autograd.grad(new.loss, steps)
    # the same objective with the walk on the host, as onpolicy_cells took it before
    monkeypatch.setattr(onpolicy_module, "round_starts", _host_starts)
    old_cells = onpolicy_cells(steps, target.argmax(-1), **args)
    old = onpolicy_loss(steps, target, decay=0.6, **args)
    old_grads = torch.autograd.grad(old.loss, steps)
    for a, b in zip(cells.accepted + cells.rejected, old_cells.accepted + old_cells.rejected):
        assert a.equal(b)
    assert cells.counts.equal(old_cells.counts) and float(cells.counts[0]) > 0
    assert float(cells.counts[1]) > 0  # some rounds accepted a draft: the accepted cells were exercised
    assert new.loss.detach().equal(old.loss.detach())
    assert all(x.equal(y) for x, y in zip(grads, old_grads))
    assert new.metrics() == old.metrics()
