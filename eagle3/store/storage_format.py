"""How a shard holds the hidden states: the on-disk format (``capture.storage``), distinct from
the capture dtype (what the target computes them in, and what a reader gets back).

    exact   hidden [T, L, H] in the capture dtype: the states as captured.
    fp8     hidden_aux [T, L-1, H] float8_e4m3fn: the aux layers (every id but the last), each
            token's row of each layer divided by its own scale (amax / 448, so the largest value
            lands on e4m3's largest finite number); hidden_aux_scale [T, L-1] bfloat16, those scales;
            hidden_final [T, 1, H] in the capture dtype: the last id, the target's final state.

The final layer stays exact because it is the state the trainer turns into the teacher's
distribution (lm_head of it gives p_t, the target's next-token probabilities the head learns):
an error there moves the labels themselves, while an error in the aux layers is only noise in
the head's input. It costs H x 2 bytes of the (L-1) x H + H x 2 per token (SmolLM2, L=4: 0.63x of
bf16 in all; fp8 everywhere would be 0.5x). docs/architecture.md (dataset format) gives the
figures measured for both.

A scale per token and layer, not per tensor: hidden-state rows differ in magnitude by orders (the
first token's "attention sink" row is often 100x the others), and one scale for all would leave the
ordinary rows a few of e4m3's 3-bit-mantissa steps. The scale is rounded to bf16 before the
values are divided by it, so it is stored in 2 bytes at no cost in accuracy, and decoding is one
product per value rounded once: for a bf16 capture it runs on the bits (the e4m3 code moved into
bf16's fields is the value x 2^-120, exactly, subnormals included), faster on a CPU than
torch's float8 conversion.
"""

from __future__ import annotations

import torch

from eagle3.util.hidden_dtypes import EXACT, FP8, INT4, INT4_GROUP, STORAGES, check_storage

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
_TINY = 1e-30  # the scale of an all-zero row: its values all encode as 0
_BIAS = 2.0**120  # e4m3's exponent bias (7) against bf16's (127)
_BITS_SCALE_MAX = 2.0**7  # a larger scale x 2^120 would overflow bf16: decoded by the float path

INT4_MAX = 7  # symmetric 4-bit codes -7..7, stored + 8 (1..15) two to a byte

__all__ = [
    "EXACT",
    "FP8",
    "INT4",
    "STORAGES",
    "check_storage",
    "check_width",
    "decode",
    "encode",
    "tensor_names",
    "tensor_shapes",
]


def check_width(storage: str, hidden_size: int) -> str | None:
    """Why ``storage`` cannot hold states of this width (None: it can)."""
    if storage == INT4 and int(hidden_size) % INT4_GROUP:
        return f"int4 groups {INT4_GROUP} channels: expected a hidden size divisible by it, got {hidden_size}"
    return None


def tensor_names(storage: str) -> tuple[str, ...]:
    """The hidden-state tensors a shard of this format holds (beside input_ids, loss_mask, offsets)."""
    if check_storage(storage, "storage") == EXACT:
        return ("hidden",)
    return ("hidden_aux", "hidden_aux_scale", "hidden_final")


def tensor_shapes(storage: str, num_tokens: int, num_layers: int, hidden_size: int) -> dict[str, list[int]]:
    """Each hidden-state tensor's shape in a shard of ``num_tokens`` tokens."""
    T, L, H = int(num_tokens), int(num_layers), int(hidden_size)
    if check_storage(storage, "storage") == EXACT:
        return {"hidden": [T, L, H]}
    if storage == INT4:
        return {
            "hidden_aux": [T, L - 1, H // 2],
            "hidden_aux_scale": [T, L - 1, H // INT4_GROUP],
            "hidden_final": [T, 1, H],
        }
    return {"hidden_aux": [T, L - 1, H], "hidden_aux_scale": [T, L - 1], "hidden_final": [T, 1, H]}


def encode(hidden: torch.Tensor, storage: str) -> dict[str, torch.Tensor]:
    """One sample's hidden [T, L, H] (capture dtype) as the tensors ``storage`` writes."""
    if check_storage(storage, "storage") == EXACT:
        return {"hidden": hidden}
    if storage == INT4:
        return _encode_int4(hidden)
    aux = hidden[:, :-1].float()  # [T, L-1, H]
    scale = (aux.abs().amax(dim=-1) / FP8_MAX).clamp_min(_TINY).to(torch.bfloat16)  # [T, L-1]
    # the amax of a row whose scale rounded down lands a hair above 448: saturated (< 0.4% off)
    q = (aux / scale.float().unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [T, L-1, H]
    return {"hidden_aux": q, "hidden_aux_scale": scale, "hidden_final": hidden[:, -1:].contiguous()}


def decode(rows: dict[str, torch.Tensor], storage: str, dtype: torch.dtype) -> torch.Tensor:
    """hidden [T, L, H] in ``dtype`` from a sample's rows of the tensors ``storage`` wrote."""
    if check_storage(storage, "storage") == EXACT:
        return rows["hidden"]
    if storage == INT4:
        return _decode_int4(rows, dtype)
    q, scale, final = rows["hidden_aux"], rows["hidden_aux_scale"], rows["hidden_final"]
    T, La, H = q.shape
    out = torch.empty((T, La + 1, H), dtype=dtype)
    if dtype == torch.bfloat16 and (scale.numel() == 0 or float(scale.max()) < _BITS_SCALE_MAX):
        x = q.view(torch.uint8).to(torch.int16)
        bits = ((x & 0x80) << 8) | ((x & 0x7F) << 4)  # sign, exponent and mantissa in bf16's places
        torch.mul(bits.view(torch.bfloat16), scale.unsqueeze(-1) * _BIAS, out=out[:, :La])
    else:
        out[:, :La] = q.to(torch.float32).mul_(scale.float().unsqueeze(-1))  # rounded once, to dtype
    out[:, La:] = final
    return out


def _encode_int4(hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """The aux layers in 4 bits: each group of INT4_GROUP channels of a row at its own scale
    (amax / 7, rounded to bf16), codes -7..7 stored + 8, two to a byte (even channel low)."""
    T, L, H = hidden.shape
    g = hidden[:, :-1].float().reshape(T, L - 1, H // INT4_GROUP, INT4_GROUP)
    scale = (g.abs().amax(dim=-1) / INT4_MAX).clamp_min(_TINY).to(torch.bfloat16)  # [T, L-1, H/G]
    q = (g / scale.float().unsqueeze(-1)).round_().clamp_(-INT4_MAX, INT4_MAX).add_(8).to(torch.uint8)
    q = q.reshape(T, L - 1, H // 2, 2)
    packed = q[..., 0] | (q[..., 1] << 4)  # [T, L-1, H/2]
    return {"hidden_aux": packed, "hidden_aux_scale": scale, "hidden_final": hidden[:, -1:].contiguous()}


def _decode_int4(rows: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    packed, scale, final = rows["hidden_aux"], rows["hidden_aux_scale"], rows["hidden_final"]
    T, La, half = packed.shape
    H = 2 * half
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).reshape(T, La, H // INT4_GROUP, INT4_GROUP)
    out = torch.empty((T, La + 1, H), dtype=dtype)
    aux = (codes.to(torch.int8) - 8).to(torch.float32).mul_(scale.float().unsqueeze(-1))
    out[:, :La] = aux.reshape(T, La, H)
    out[:, La:] = final
    return out
