"""collate_packed(pad_to=...): the fixed-shape rows a compiled step needs change nothing the
loss or the metrics see."""

from __future__ import annotations

import torch
from helpers import VT, H, make_head

from eagle3.draft import eagle3_loss
from eagle3.store.packing import collate_packed


def _item(t: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, VT, (t,), generator=g),
        "loss_mask": torch.arange(t) >= 2,
        "hidden": torch.randn(t, 4, H, generator=g),
    }


def _loss(head, batch):
    logits = head(batch["aux_hidden"], batch["input_ids"], batch["position_ids"], batch["segment_ids"], 3)
    return eagle3_loss(
        logits,
        head.target_logits(batch["final_hidden"]),
        loss_mask=batch["loss_mask"],
        segment_ids=batch["segment_ids"],
        step_decay=0.8,
    )


def test_padding_to_a_fixed_shape_changes_no_loss_or_count():
    head = make_head()
    items = [_item(9, 1), _item(6, 2), _item(11, 3)]
    plain = collate_packed(items, max_tokens=32)
    padded = collate_packed(items, max_tokens=32, pad_to=32)
    assert plain["input_ids"].shape == (1, 26) and padded["input_ids"].shape == (1, 32)
    assert padded["segment_ids"][0, 26:].eq(-1).all() and not padded["loss_mask"][0, 26:].any()
    assert int(plain["num_tokens"]) == int(padded["num_tokens"]) == 26  # real tokens, padding not counted
    for k in plain.keys() - {"num_tokens"}:
        assert torch.equal(padded[k][:, :26], plain[k]), k
    loss_a, counts_a = _loss(head, plain)
    loss_b, counts_b = _loss(head, padded)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-6, atol=1e-6)
    for name in ("loss_count", "acc_count", "correct_full", "cond_count"):
        assert torch.equal(getattr(counts_a, name), getattr(counts_b, name)), name
    # a row cut at max_tokens is already full: pad_to adds nothing
    assert collate_packed(items, max_tokens=20, pad_to=20)["input_ids"].shape == (1, 20)


def test_rows_hold_every_sample_once_within_their_budgets():
    from eagle3.store.packing import pack_rows, split_rows

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 300, (700,), generator=g).tolist()  # > one 256-sample bucket
    batches = pack_rows(lengths, max_tokens=4096, row_tokens=1024, seed=3)
    seen = sorted(i for b in batches for i in b)
    assert seen == list(range(len(lengths)))
    for b in batches:
        assert sum(lengths[i] for i in b) <= 4096
        rows = split_rows([{"input_ids": torch.zeros(lengths[i])} for i in b], 1024)
        assert 1 <= len(rows) <= 4 and all(sum(r["input_ids"].shape[0] for r in row) <= 1024 for row in rows)
    # rows ~7 mean samples long cut the budget into 4 x 1024 instead of 1 x 4096: packing stays tight
    single = pack_rows(lengths, max_tokens=4096, row_tokens=None, seed=3)
    assert len(batches) <= 1.1 * len(single)


def test_several_rows_give_the_same_loss_and_counts_as_one_row():
    from eagle3.store.packing import collate_rows

    head = make_head()
    items = [_item(9, 1), _item(6, 2), _item(11, 3), _item(4, 4), _item(12, 5)]
    one = collate_rows(items, max_tokens=64, row_tokens=None)
    rows = collate_rows(items, max_tokens=64, row_tokens=16)
    # 9, 6 (15) | 11, 4 (15) | 12: three rows, padded to the longest (15)
    assert one["input_ids"].shape == (1, 42) and rows["input_ids"].shape == (3, 15)
    assert rows["segment_ids"][2, 12:].eq(-1).all() and not rows["loss_mask"][2, 12:].any()
    fixed = collate_rows(items, max_tokens=64, row_tokens=16, fixed_shape=True)
    assert fixed["input_ids"].shape == (4, 16)
    assert collate_rows(items[:2], max_tokens=64, row_tokens=16, fixed_shape=True)["segment_ids"][1:].eq(-1).all()
    loss_a, counts_a = _loss(head, one)
    for batch in (rows, fixed):
        _, counts_b = _loss(head, batch)
        torch.testing.assert_close(counts_b.loss_sum, counts_a.loss_sum, rtol=1e-5, atol=1e-5)
        for name in ("loss_count", "acc_count", "correct_full", "cond_count"):
            assert torch.equal(getattr(counts_a, name), getattr(counts_b, name)), name
