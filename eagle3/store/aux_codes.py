"""The aux layers' codes: how an fp8 or int4 shard holds every layer but the last
(``StorageFormat`` in eagle3/store/storage_format.py picks the code and places the final layer).

    fp8     hidden_aux [..., L-1, H] float8_e4m3fn, each token's row of each layer divided by its
            own scale (amax / 448, so the largest value lands on e4m3's largest finite number);
            hidden_aux_scale [..., L-1] bfloat16, those scales.
    int4    hidden_aux [..., L-1, H/2] uint8, each group of INT4_GROUP channels of a row at its own
            scale (amax / 7), codes -7..7 stored + 8, two to a byte (even channel low);
            hidden_aux_scale [..., L-1, H/INT4_GROUP] bfloat16.

A scale per token and layer, not per tensor: hidden-state rows differ in magnitude by orders (the
first token's "attention sink" row is often 100x the others), and one scale for all would leave the
ordinary rows a few of e4m3's 3-bit-mantissa steps. The scale is rounded to bf16 before the
values are divided by it, so it is stored in 2 bytes at no cost in accuracy, and decoding is one
product per value rounded once: for a bf16 capture it runs on the bits (the e4m3 code moved into
bf16's fields is the value x 2^-120, exactly, subnormals included), faster on a CPU than
torch's float8 conversion.

The math runs on whatever device holds the tensors, with any leading dims, and gives the same bits
on each: a GPU capture encodes before its copy to the host and writes the bytes a CPU encode
writes. Off the CPU, decode takes the float path (the bits path needs the largest scale on the
host, a wait for the device): it rounds the same exact product once, so the two paths agree bit
for bit (tests/unit/store/test_storage_device.py) for every code but e4m3's NaN, which no encode of finite
states writes (the capture refuses NaN); the float path decodes it to NaN.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
INT4_MAX = 7  # symmetric 4-bit codes -7..7, stored + 8 (1..15) two to a byte
INT4_GROUP = 32  # int4: channels that share one scale
_TINY = 1e-30  # the scale of an all-zero row: its values all encode as 0
_BIAS = 2.0**120  # e4m3's exponent bias (7) against bf16's (127)
_BITS_SCALE_MAX = 2.0**7  # a larger scale x 2^120 would overflow bf16: decoded by the float path
_BF16_FROM_E4M3 = -0x7810  # 0x87F0 as an int16: bf16's sign bit and the 7 bits e4m3's code fills


def _divide(x: torch.Tensor, by: float) -> torch.Tensor:
    """``x / by``, a true division on every device. CUDA computes a division by a Python number as
    a product with its reciprocal, and 1/448 and 1/7 are inexact: a quotient may differ from the
    CPU's in its last bit, and so may its bf16 scale. A divisor on the tensor's device is divided by."""
    return x / torch.full((), by, dtype=x.dtype, device=x.device)


def encode_fp8(hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """The aux layers of hidden [..., L, H] in e4m3 with a bf16 scale per token and layer."""
    aux = hidden[..., :-1, :].float()  # [..., L-1, H]
    scale = _divide(aux.abs().amax(dim=-1), FP8_MAX).clamp_min(_TINY).to(torch.bfloat16)  # [..., L-1]
    # the amax of a row whose scale rounded down lands a hair above 448: saturated (< 0.4% off)
    q = (aux / scale.float().unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [..., L-1, H]
    return {"hidden_aux": q, "hidden_aux_scale": scale}


def decode_fp8_into(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, float_path: bool = False) -> None:
    """The fp8 aux layers [..., L-1, H] decoded into ``out`` (its dtype), one rounding per value."""
    bits_path = out.dtype == torch.bfloat16 and q.device.type == "cpu" and not float_path
    if bits_path and (scale.numel() == 0 or float(scale.max()) < _BITS_SCALE_MAX):
        # sign-extended to 16 bits and shifted by 4: the sign lands on bit 15, exponent and mantissa
        # on bf16's bits 10..4; the mask clears the copies of the sign in between (bits 14..11)
        bits = q.view(torch.int8).to(torch.int16).bitwise_left_shift_(4).bitwise_and_(_BF16_FROM_E4M3)
        torch.mul(bits.view(torch.bfloat16), scale.unsqueeze(-1) * _BIAS, out=out)
    else:
        out.copy_(q.to(torch.float32).mul_(scale.float().unsqueeze(-1)))  # rounded once, to out's dtype


def fp8_has_nan(q: torch.Tensor) -> bool:
    """Whether any e4m3fn code is NaN (every exponent and mantissa bit set: 0x7F, 0xFF)."""
    return bool((q.view(torch.uint8) & 0x7F).eq_(0x7F).any())


def encode_int4(hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """The aux layers of hidden [..., L, H] in 4 bits: each group of INT4_GROUP channels of a row
    at its own scale (amax / 7, rounded to bf16), codes -7..7 stored + 8, two to a byte (even
    channel low)."""
    *lead, L, H = hidden.shape
    g = hidden[..., :-1, :].float().reshape(*lead, L - 1, H // INT4_GROUP, INT4_GROUP)
    scale = _divide(g.abs().amax(dim=-1), INT4_MAX).clamp_min(_TINY).to(torch.bfloat16)  # [..., L-1, H/G]
    q = (g / scale.float().unsqueeze(-1)).round_().clamp_(-INT4_MAX, INT4_MAX).add_(8).to(torch.uint8)
    q = q.reshape(*lead, L - 1, H // 2, 2)
    packed = q[..., 0] | (q[..., 1] << 4)  # [..., L-1, H/2]
    return {"hidden_aux": packed, "hidden_aux_scale": scale}


def decode_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [..., L-1, H]: each code (-7..7) times its group's scale, exact."""
    *lead, La, half = packed.shape
    H = 2 * half
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).reshape(*lead, La, H // INT4_GROUP, INT4_GROUP)
    aux = (codes.to(torch.int8) - 8).to(torch.float32).mul_(scale.float().unsqueeze(-1))
    return aux.reshape(*lead, La, H)
