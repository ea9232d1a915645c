"""The training-time-test (TTT) attention mask, as a dense boolean tensor for SDPA.

At TTT step k the keys are the concatenation [K_0 | K_1 | ... | K_k] of every step's keys,
each block T long (block j holds step j's key for every position). Query t may attend:

- block 0: positions s <= t of its own segment (causal within one packed sample);
- block j >= 1: only its own key at position t (the "diagonal"): step j's input at t
  depends on the drafts of steps < j at t, which no other position shares.

Block 0 also always contains (t, t), so padding rows (segment -1) attend to themselves and
SDPA never sees an all-False row (that would give NaN). Padding outputs are garbage by
design and never reach the loss.

Memory: one bool [B, 1, T, T * num_steps] (T=2048, 7 steps: 29 MB per row), built once per
batch; step k uses the first k+1 blocks (a view, no copy).
"""

from __future__ import annotations

import torch


def causal_segment_block(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids [B, T] (int, -1 = padding) -> bool [B, T, T]: causal within a segment."""
    if segment_ids.dim() != 2:
        raise ValueError(f"segment_ids: expected [B, T], got shape {tuple(segment_ids.shape)}")
    t = segment_ids.shape[1]
    pos = torch.arange(t, device=segment_ids.device)
    causal = pos[None, :] <= pos[:, None]  # [T(q), T(k)]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    valid_q = (segment_ids >= 0)[:, :, None]
    eye = torch.eye(t, dtype=torch.bool, device=segment_ids.device)
    return (causal[None] & same & valid_q) | eye[None]


def build_ttt_mask(segment_ids: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Bool [B, 1, T, T * num_steps] (True = may attend); step k uses `ttt_step_mask(mask, k)`."""
    if num_steps < 1:
        raise ValueError(f"num_steps: expected >= 1, got {num_steps}")
    b, t = segment_ids.shape
    mask = torch.zeros(b, 1, t, t * num_steps, dtype=torch.bool, device=segment_ids.device)
    mask[:, 0, :, :t] = causal_segment_block(segment_ids)
    for step in range(1, num_steps):
        # the diagonal of block `step`, filled through a view: indexing with a Python True would
        # copy that scalar from the host, a wait for the GPU in every step
        mask[:, 0, :, step * t : (step + 1) * t].diagonal(dim1=-2, dim2=-1).fill_(True)
    return mask


def ttt_step_mask(mask: torch.Tensor, step: int) -> torch.Tensor:
    """The keys visible at TTT step `step`: the first step+1 blocks of `build_ttt_mask`."""
    t = mask.shape[2]
    if (step + 1) * t > mask.shape[3]:
        raise ValueError(f"ttt_step_mask: mask holds {mask.shape[3] // t} steps, asked for step {step}")
    return mask[..., : (step + 1) * t]
