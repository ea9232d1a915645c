"""Noise on the aux hidden states a training step reads (EAGLE's feature noise).

At serving time the head drafts from states the target computed on the head's own accepted
tokens, never exactly those of the training answers; a head that has memorised its training
states drafts worse on traffic it never saw. Uniform noise on the aux features, sized relative to
each state (an aux layer's RMS at that token), makes the head read a neighbourhood of each state
instead of the state itself. Relative amplitude keeps one value meaningful across targets and
layers whose residual streams differ in scale by orders of magnitude.
"""

from __future__ import annotations

import torch


def add_feature_noise(aux_hidden: torch.Tensor, amount: float, num_aux_layers: int) -> torch.Tensor:
    """``aux_hidden`` [B, T, L*H] plus U(-amount, amount) times each aux layer's RMS at each token.
    ``amount`` 0 returns the tensor itself (the step is then bit for bit the noiseless one)."""
    if amount < 0:
        raise ValueError(f"train.feature_noise: expected >= 0, got {amount}")
    if amount == 0:
        return aux_hidden
    b, t, width = aux_hidden.shape
    if width % num_aux_layers:
        raise ValueError(f"aux_hidden width {width} is not num_aux_layers={num_aux_layers} states wide")
    states = aux_hidden.float().view(b, t, num_aux_layers, width // num_aux_layers)  # [B, T, L, H]
    rms = states.pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, L, 1]
    noise = (torch.rand_like(states) * 2 - 1) * (amount * rms)  # [B, T, L, H]
    return (states + noise).view(b, t, width).to(aux_hidden.dtype)  # [B, T, L*H]
