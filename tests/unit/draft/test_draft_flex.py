"""attention="flex" (block-sparse TTT masks for CUDA) computes what the dense SDPA mask does:
same draft logits and loss on packed rows with padding (eager reference kernel; this torch
has no FlexAttention backward on CPU, so gradients are compared only where CUDA exists)."""

from __future__ import annotations

import pytest
import torch
from helpers import VT, H, make_head

from eagle3.draft import eagle3_loss
from eagle3.draft.flex import FLEX_BLOCK, build_flex_masks


def _row():
    g = torch.Generator().manual_seed(3)
    lengths = [100, 60, 70]  # 230 tokens + 26 padding = 2 blocks of 128
    t = 2 * FLEX_BLOCK
    seg = torch.full((1, t), -1)
    pos = torch.zeros(1, t, dtype=torch.long)
    start = 0
    for s, n in enumerate(lengths):
        seg[0, start : start + n] = s
        pos[0, start : start + n] = torch.arange(n)
        start += n
    return dict(
        aux=torch.randn(1, t, 3 * H, generator=g),
        ids=torch.randint(0, VT, (1, t), generator=g),
        z=torch.randn(1, t, H, generator=g),
        mask=(seg >= 0) & (pos >= 2),
        seg=seg,
        pos=pos,
    )


def _run(head, x, steps):
    logits = head(x["aux"], x["ids"], x["pos"], x["seg"], steps)
    loss, counts = eagle3_loss(
        logits, head.target_logits(x["z"]), loss_mask=x["mask"], segment_ids=x["seg"], step_decay=0.8
    )
    return logits, loss, counts


def _compare(steps: int, device: str, backward: bool):
    x = {k: v.to(device) for k, v in _row().items()}
    dense_head, flex_head = make_head().to(device), make_head().to(device)
    flex_head.attention = "flex"
    with torch.set_grad_enabled(backward):
        dl, dloss, dcounts = _run(dense_head, x, steps)
        fl, floss, fcounts = _run(flex_head, x, steps)
    valid = x["seg"][0] >= 0  # padding rows are garbage by design in both
    for a, b in zip(dl, fl):
        torch.testing.assert_close(b[0, valid], a[0, valid], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(floss, dloss, rtol=1e-5, atol=1e-5)
    assert torch.equal(fcounts.correct_full, dcounts.correct_full)
    if backward:
        dloss.backward()
        floss.backward()
        for (name, a), b in zip(dense_head.named_parameters(), flex_head.parameters()):
            if a.grad is not None:
                torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("steps", [1, 3])
def test_flex_equals_dense_mask(steps):
    _compare(steps, "cpu", backward=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA")
@pytest.mark.parametrize("steps", [1, 3])
def test_flex_gradients_equal_dense_mask_on_cuda(steps):
    _compare(steps, "cuda", backward=True)


def test_flex_refuses_shapes_it_cannot_tile():
    with pytest.raises(ValueError, match="row length 200 must be a multiple of 128"):
        build_flex_masks(torch.zeros(1, 200, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"one packed row per batch \(B=1\), got B=2"):
        build_flex_masks(torch.zeros(2, 256, dtype=torch.long), 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA")
def test_flex_in_bf16_is_as_close_to_fp32_as_dense_is():
    """In bf16 flex and dense differ by more than in fp32 (up to ~0.1 in a logit): not a mask
    difference but rounding. Each kernel sums the attention in its own order and tiling in
    bf16; both land equally close to the fp32 result, which is what this checks."""
    x = {k: v.to("cuda") for k, v in _row().items()}
    valid = x["seg"][0] >= 0
    ref_logits, _, _ = _run(make_head().to("cuda"), x, 3)  # fp32 dense: the reference
    errors = {}
    for kind in ("sdpa", "flex"):
        head = make_head().to("cuda")
        head.attention = kind
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _, _ = _run(head, x, 3)
        errors[kind] = max(float((a[0, valid].float() - r[0, valid]).abs().max()) for a, r in zip(logits, ref_logits))
    assert errors["flex"] <= 2 * errors["sdpa"] + 1e-2, errors
    assert errors["sdpa"] > 0  # bf16 really rounded: the comparison is not 0 <= 0
