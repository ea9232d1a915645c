"""The TTT attention mask as flex-attention block masks (``attention="flex"``, for CUDA).

Same mask as ``mask.py`` (block 0 causal within a segment, blocks 1..k the diagonal), but
block-sparse: with 128-token blocks, step k touches the causal half of block 0 plus one
diagonal block per earlier step instead of a dense bool [T, T * (k+1)], and no keys past
step k exist (the kernel gets the keys of all steps, padded, and the block mask stops at
the current step). It is the CUDA default because in the bench (Llama-3.1-8B shapes, TTT 3,
compiled step) it beat both speculators' compiled step and our dense-mask SDPA path
(docs/records/2026-12-01-train-step-vs-speculators.md).

Constraints: one packed row per batch (B = 1) and T a multiple of FLEX_BLOCK (the
datamodule pads rows when ``fixed_shape``). flex_attention runs eagerly as a slow reference
anywhere; it is fast only under torch.compile on a GPU.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import torch

from eagle3.draft.mask import causal_segment_block

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

FLEX_BLOCK = 128
# the compiled (Triton) flex kernel needs head_dim >= 16; smaller heads (tiny test models)
# stay on the eager reference, whose dense scores are small at their row lengths
MIN_COMPILED_HEAD_DIM = 16


def _dense_to_kv_blocks(block_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [Qb, KVb] -> (num [1,1,Qb] int32, indices [1,1,Qb,KVb] int32), present blocks first, ascending."""
    num = block_map.sum(-1).to(torch.int32)
    order = torch.argsort((~block_map).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[None, None], order[None, None]


def check_flex_shape(segment_ids: torch.Tensor) -> None:
    b, t = segment_ids.shape
    if b != 1:
        raise ValueError(f"attention=flex: expected one packed row per batch (B=1), got B={b}")
    if t % FLEX_BLOCK:
        raise ValueError(
            f"attention=flex: row length {t} must be a multiple of {FLEX_BLOCK} "
            "(pad rows: train.compile=true pads them to max_tokens_per_batch)"
        )


def build_flex_masks(segment_ids: torch.Tensor, num_steps: int) -> list[BlockMask]:
    """One BlockMask per TTT step over keys [K_0 | ... | K_{num_steps-1}] (all steps, padded)."""
    from torch.nn.attention.flex_attention import BlockMask

    check_flex_shape(segment_ids)
    t = segment_ids.shape[1]
    nb = t // FLEX_BLOCK
    dense0 = causal_segment_block(segment_ids)[0].view(nb, FLEX_BLOCK, nb, FLEX_BLOCK)
    any0, all0 = dense0.any(dim=(1, 3)), dense0.all(dim=(1, 3))
    eye = torch.eye(nb, dtype=torch.bool, device=segment_ids.device)
    none = torch.zeros_like(eye)
    seg = segment_ids[0]

    def step_mask_mod(limit: torch.Tensor) -> Callable[..., torch.Tensor]:
        # mask.py's rule; limit = (step + 1) * t
        def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            blk = kv // t
            kvp = kv - blk * t
            own = (kvp <= q) & (seg[kvp] == seg[q]) & (seg[q] >= 0)
            return ((blk == 0) & (own | (kvp == q))) | ((blk > 0) & (kvp == q) & (kv < limit))

        return mask_mod

    masks = []
    for step in range(num_steps):
        # the limit is a tensor, not an int, so a compiled kernel is not specialised per step
        mask_mod = step_mask_mod(torch.tensor((step + 1) * t, device=segment_ids.device))
        diag = [eye if j <= step else none for j in range(1, num_steps)]
        partial = torch.cat([any0 & ~all0, *diag], dim=1)
        full = torch.cat([all0, *[none] * (num_steps - 1)], dim=1)
        kv_num, kv_idx = _dense_to_kv_blocks(partial)
        full_num, full_idx = _dense_to_kv_blocks(full)
        masks.append(
            BlockMask.from_kv_blocks(
                kv_num,
                kv_idx,
                full_num,
                full_idx,
                BLOCK_SIZE=FLEX_BLOCK,
                mask_mod=mask_mod,
                seq_lengths=(t, t * num_steps),
            )
        )
    return masks


def flex_attend(
    q: torch.Tensor,
    past_keys: list[torch.Tensor],
    past_values: list[torch.Tensor],
    block_mask: BlockMask,
    enable_gqa: bool,
) -> torch.Tensor:
    """q [B, heads, T, hd] against the keys of the steps so far, padded to the mask's length."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    t = q.shape[2]
    pad = block_mask.seq_lengths[1] - t * len(past_keys)
    keys = F.pad(torch.cat(past_keys, dim=2), (0, 0, 0, pad))
    values = F.pad(torch.cat(past_values, dim=2), (0, 0, 0, pad))
    if q.is_cuda and not torch.compiler.is_compiling() and q.shape[-1] >= MIN_COMPILED_HEAD_DIM:
        # called eagerly (validation, an uncompiled step): torch's eager flex_attention is a
        # dense reference that materialises [T, K x T] scores (11 GiB for one 16k-token row at
        # 9 heads); the compiled kernel keeps the block sparsity
        return _compiled_flex_attention()(q, keys, values, block_mask=block_mask, enable_gqa=enable_gqa)
    return flex_attention(q, keys, values, block_mask=block_mask, enable_gqa=enable_gqa)


@functools.cache
def _compiled_flex_attention() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)
