"""The TTT attention mask as an explicit truth table, and what SDPA makes of it."""

import torch
import torch.nn.functional as F

from eagle3.draft.mask import build_ttt_mask, causal_segment_block, ttt_step_mask

I = torch.eye(4, dtype=torch.bool)


def _table(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_truth_table_two_segments_three_steps():
    # T=4: sample A = positions 0,1; sample B = positions 2,3
    mask = build_ttt_mask(torch.tensor([[0, 0, 1, 1]]), num_steps=3)
    assert mask.shape == (1, 1, 4, 12) and mask.dtype == torch.bool
    block0 = _table(
        [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 1, 0],  # B's first token does not see A
            [0, 0, 1, 1],
        ]
    )
    expected = torch.cat([block0, I, I], dim=1)  # steps 1, 2: only the diagonal
    assert torch.equal(mask[0, 0], expected)
    # step k sees the first k+1 blocks
    assert torch.equal(ttt_step_mask(mask, 0)[0, 0], block0)
    assert torch.equal(ttt_step_mask(mask, 1)[0, 0], torch.cat([block0, I], dim=1))
    assert torch.equal(ttt_step_mask(mask, 2)[0, 0], expected)


def test_padding_rows_see_only_themselves_and_are_never_seen():
    mask = build_ttt_mask(torch.tensor([[0, 0, 1, -1], [0, 0, 0, 0]]), num_steps=2)
    assert torch.equal(
        mask[0, 0, :, :4],
        _table(
            [
                [1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 0, 1, 0],
                [0, 0, 0, 1],  # padding: self only, so softmax has one finite entry
            ]
        ),
    )
    assert torch.equal(mask[1, 0, :, :4], torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert torch.equal(mask[1, 0, :, 4:], I)


def test_segment_block_keeps_causality_within_one_long_segment():
    blk = causal_segment_block(torch.zeros(1, 6, dtype=torch.long))[0]
    assert torch.equal(blk, torch.tril(torch.ones(6, 6, dtype=torch.bool)))


def test_sdpa_with_the_mask_is_finite_and_matches_manual_softmax():
    torch.manual_seed(0)
    seg = torch.tensor([[0, 0, 0, 1, 1, -1]])
    mask = ttt_step_mask(build_ttt_mask(seg, 3), 2)  # step 2: 3 blocks of keys
    q = torch.randn(1, 2, 6, 8)
    k = torch.randn(1, 2, 18, 8)
    v = torch.randn(1, 2, 18, 8)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all()
    scores = (q @ k.transpose(-1, -2)) / 8**0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    manual = scores.softmax(-1) @ v
    torch.testing.assert_close(out, manual, rtol=1e-5, atol=1e-6)
