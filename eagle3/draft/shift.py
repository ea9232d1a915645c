"""Segment-aware shifting: the one place that knows how TTT step k lines positions up.

All per-sample tensors arrive aligned at the same positions t (token x_t, aux features
g_t, final state z_t: the states after processing x_t). TTT step k at position t reads
x_{t+1+k} and is scored against p_{t+1+k} (from z_{t+1+k}), which predicts x_{t+2+k}.
"Later position of the same sample" is what `shift_left` looks up; anything past the end
of a sample (the next packed sample, padding, or the end of the row) is invalid.
"""

from __future__ import annotations

import torch


def shift_left(
    values: torch.Tensor, segment_ids: torch.Tensor, offset: int, fill: float | int | bool = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """out[:, t] = values[:, t + offset] where t + offset is in t's segment, else `fill`.

    values [B, T, ...]; segment_ids [B, T] (-1 = padding). Returns (out, valid [B, T] bool).
    """
    if offset < 0:
        raise ValueError(f"shift_left: offset must be >= 0, got {offset}")
    b, t = segment_ids.shape
    if values.shape[:2] != (b, t):
        raise ValueError(
            f"shift_left: values shape {tuple(values.shape)} does not start with segment_ids shape {(b, t)}"
        )
    valid = torch.zeros(b, t, dtype=torch.bool, device=segment_ids.device)
    out = torch.full_like(values, fill)
    if offset < t:
        n = t - offset
        same = (segment_ids[:, offset:] == segment_ids[:, :n]) & (segment_ids[:, :n] >= 0)
        valid[:, :n] = same
        shifted = values[:, offset:]
        keep = same.view(b, n, *([1] * (values.dim() - 2)))
        out[:, :n] = torch.where(keep, shifted, out[:, :n])
    return out, valid
