"""collate_packed(pad_to=...): the fixed-shape rows a compiled step needs change nothing the
loss or the metrics see."""

from __future__ import annotations

import torch

from eagle3.model import eagle3_loss
from eagle3.training.batching import collate_packed
from test_model_head import H, VT, make_head


def _item(t: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, VT, (t,), generator=g), "loss_mask": torch.arange(t) >= 2,
            "hidden": torch.randn(t, 4, H, generator=g)}


def _loss(head, batch):
    logits = head(batch["aux_hidden"], batch["input_ids"], batch["position_ids"], batch["segment_ids"], 3)
    return eagle3_loss(logits, head.target_logits(batch["final_hidden"]), loss_mask=batch["loss_mask"],
                       segment_ids=batch["segment_ids"], step_decay=0.8)


def test_padding_to_a_fixed_shape_changes_no_loss_or_count():
    head = make_head()
    items = [_item(9, 1), _item(6, 2), _item(11, 3)]
    plain = collate_packed(items, max_tokens=32)
    padded = collate_packed(items, max_tokens=32, pad_to=32)
    assert plain["input_ids"].shape == (1, 26) and padded["input_ids"].shape == (1, 32)
    assert padded["segment_ids"][0, 26:].eq(-1).all() and not padded["loss_mask"][0, 26:].any()
    for k in plain:
        assert torch.equal(padded[k][:, :26], plain[k]), k
    loss_a, counts_a = _loss(head, plain)
    loss_b, counts_b = _loss(head, padded)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-6, atol=1e-6)
    for name in ("loss_count", "acc_count", "correct_full", "cond_count"):
        assert torch.equal(getattr(counts_a, name), getattr(counts_b, name)), name
    # a row cut at max_tokens is already full: pad_to adds nothing
    assert collate_packed(items, max_tokens=20, pad_to=20)["input_ids"].shape == (1, 20)
