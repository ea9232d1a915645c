"""Token frequencies over loss-masked tokens and the draft vocabulary (d2t/t2d) as
docs/architecture.md defines them: top-V by frequency, ties by smaller id, sorted by id, padded with
the smallest unseen ids, d2t[i] = target_id[i] - i."""

from __future__ import annotations

import pytest
import torch

from eagle3.data import build_draft_vocab, token_frequencies


def _target_ids(d2t: torch.Tensor) -> list[int]:
    return (torch.arange(d2t.numel()) + d2t).tolist()


def test_frequencies_count_only_loss_masked_tokens():
    samples = [
        (torch.tensor([5, 1, 1, 2, 7]), torch.tensor([0, 1, 1, 0, 1], dtype=torch.bool)),
        (torch.tensor([7, 7, 3]), torch.tensor([1, 1, 0], dtype=torch.bool)),
        (torch.tensor([4]), torch.tensor([0], dtype=torch.bool)),  # nothing counted
    ]
    freq = token_frequencies(samples, vocab_size=8)
    assert freq.dtype == torch.long
    assert freq.tolist() == [0, 2, 0, 0, 0, 0, 0, 3]


def test_frequencies_reject_ids_outside_the_vocab():
    with pytest.raises(ValueError, match=r"sample 1: token id 9 outside the target vocabulary \[0, 8\)"):
        token_frequencies([([1], [True]), ([9, 2], [True, True])], vocab_size=8)
    with pytest.raises(ValueError, match="equal 1-D shapes"):
        token_frequencies([([1, 2], [True])], vocab_size=8)


def test_draft_vocab_top_v_ties_by_smaller_id_sorted_by_id():
    freq = torch.tensor([1, 9, 4, 4, 0, 4, 9, 2])
    d2t, t2d = build_draft_vocab(freq, 4)
    # 9,9 -> ids 1,6; then three ids tie at 4 (2,3,5): the smaller ids 2,3 win
    assert _target_ids(d2t) == [1, 2, 3, 6]
    assert d2t.tolist() == [1, 1, 1, 3] and d2t.dtype == torch.long
    assert t2d.dtype == torch.bool and t2d.tolist() == [False, True, True, True, False, False, True, False]


def test_draft_vocab_pads_with_smallest_unseen_ids():
    freq = torch.zeros(10, dtype=torch.long)
    freq[[8, 4]] = torch.tensor([3, 1])
    d2t, t2d = build_draft_vocab(freq, 5)
    assert _target_ids(d2t) == [0, 1, 2, 4, 8]  # 2 seen + the 3 smallest unseen
    assert int(t2d.sum()) == 5 and t2d[8] and t2d[4] and not t2d[3]


def test_full_vocab_is_the_identity_and_oversize_is_capped_with_a_warning():
    freq = torch.tensor([3, 0, 7, 1, 1, 0])
    d2t, t2d = build_draft_vocab(freq, 6)
    assert d2t.tolist() == [0] * 6 and t2d.all()
    with pytest.warns(UserWarning, match="draft_vocab_size=32000 exceeds the target vocabulary \\(6\\)"):
        capped_d2t, capped_t2d = build_draft_vocab(freq, 32000)
    assert torch.equal(capped_d2t, d2t) and torch.equal(capped_t2d, t2d)


def test_draft_vocab_is_deterministic_and_consistent_on_a_large_vocab():
    gen = torch.Generator().manual_seed(0)
    freq = torch.randint(0, 50, (49152,), generator=gen)  # many ties
    d2t, t2d = build_draft_vocab(freq, 32000)
    again_d2t, again_t2d = build_draft_vocab(freq.clone(), 32000)
    assert torch.equal(d2t, again_d2t) and torch.equal(t2d, again_t2d)
    ids = torch.tensor(_target_ids(d2t))
    assert ids.numel() == 32000 and bool((ids[1:] > ids[:-1]).all())  # sorted, unique
    assert torch.equal(t2d.nonzero().flatten(), ids)
    # every chosen id is at least as frequent as every excluded one, and at the boundary
    # frequency the chosen ids are the smallest ones
    chosen, excluded = freq[t2d], freq[~t2d]
    assert int(chosen.min()) >= int(excluded.max())
    edge = int(chosen.min())
    edge_in = t2d.nonzero().flatten()[chosen == edge]
    edge_out = (~t2d).nonzero().flatten()[excluded == edge]
    assert edge_out.numel() == 0 or int(edge_in.max()) < int(edge_out.min())


def test_draft_vocab_from_real_rendered_samples(smollm2_dir):
    from transformers import AutoTokenizer

    from eagle3.data import load_conversations
    from eagle3.data.render import ChatRenderer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    renderer = ChatRenderer(tok)
    convs = load_conversations("sharegpt", limit=40).conversations
    samples = [renderer(c.messages, 512).sample for c in convs]
    samples = [s for s in samples if s is not None]
    freq = token_frequencies(samples, vocab_size=len(tok))
    assert int(freq.sum()) == sum(int(s.loss_mask.sum()) for s in samples)
    answers = sum(sum(m["role"] == "assistant" for m in c.messages) for c in convs)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert 0 < int(freq[im_end]) <= answers  # each answer ends in one (unless truncated)
    assert int(freq[im_start]) == 0  # scaffolding is never counted
    d2t, t2d = build_draft_vocab(freq, 2000)
    assert t2d[im_end] and int(t2d.sum()) == 2000
