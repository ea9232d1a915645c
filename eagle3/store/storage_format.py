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

The math runs on whatever device holds the tensors, with any leading dims ([T, L, H] or a batch
[B, T, L, H]: every token is encoded on its own), and gives the same bits on each: a GPU capture
encodes before its copy to the host (eagle3/target_model/host_copy.py) and writes the bytes a CPU
encode writes; a GPU training step decodes its batch after the copy to the device
(``decode_split``) into the values a loader worker's ``decode`` gives. Off the CPU, decode takes
the float path (the bits path needs the largest scale on the host, a wait for the device): it
rounds the same exact product once, so the two paths agree bit for bit (tests/unit/store/test_storage_device.py)
for every code but e4m3's NaN, which no encode of finite states writes (the capture refuses NaN);
``decodes_finite`` finds it in a damaged shard, and the float path decodes it to NaN.

With ``teacher_topk`` k (capture.teacher_topk, fp8 or int4), ``hidden_final`` is not stored: in its
place ``teacher_ids`` int32 [T, k] and ``teacher_logprobs`` float16 [T, k], the target's k most
likely next tokens (eagle3/store/teacher_topk.py). Such rows have no final layer to decode:
``decode_aux`` and ``decode_teacher`` read them, and ``decode`` / ``decode_split`` refuse them.
"""

from __future__ import annotations

import torch

from eagle3.store.teacher_topk import IDS_DTYPE, LOGPROBS_DTYPE, TEACHER_TENSORS, TeacherProjection
from eagle3.util.hidden_dtypes import EXACT, FP8, INT4, INT4_GROUP, STORAGES, check_storage, check_teacher_topk

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
_TINY = 1e-30  # the scale of an all-zero row: its values all encode as 0
_BIAS = 2.0**120  # e4m3's exponent bias (7) against bf16's (127)
_BITS_SCALE_MAX = 2.0**7  # a larger scale x 2^120 would overflow bf16: decoded by the float path
_BF16_FROM_E4M3 = -0x7810  # 0x87F0 as an int16: bf16's sign bit and the 7 bits e4m3's code fills

INT4_MAX = 7  # symmetric 4-bit codes -7..7, stored + 8 (1..15) two to a byte

__all__ = [
    "EXACT",
    "FP8",
    "INT4",
    "STORAGES",
    "check_storage",
    "check_width",
    "decode",
    "decode_aux",
    "decode_split",
    "decode_teacher",
    "decodes_finite",
    "encode",
    "tensor_dtypes",
    "tensor_names",
    "tensor_shapes",
    "teacher_valid",
]


def check_width(storage: str, hidden_size: int) -> str | None:
    """Why ``storage`` cannot hold states of this width (None: it can)."""
    if storage == INT4 and int(hidden_size) % INT4_GROUP:
        return f"int4 groups {INT4_GROUP} channels: expected a hidden size divisible by it, got {hidden_size}"
    return None


def tensor_names(storage: str, teacher_topk: int | None = None) -> tuple[str, ...]:
    """The hidden-state tensors a shard of this format holds (beside input_ids, loss_mask, offsets)."""
    if check_storage(storage, "storage") == EXACT:
        check_teacher_topk(storage, teacher_topk, "teacher_topk")
        return ("hidden",)
    final = ("hidden_final",) if check_teacher_topk(storage, teacher_topk, "teacher_topk") is None else TEACHER_TENSORS
    return ("hidden_aux", "hidden_aux_scale", *final)


def tensor_shapes(
    storage: str, num_tokens: int, num_layers: int, hidden_size: int, teacher_topk: int | None = None
) -> dict[str, list[int]]:
    """Each hidden-state tensor's shape in a shard of ``num_tokens`` tokens."""
    T, L, H = int(num_tokens), int(num_layers), int(hidden_size)
    k = check_teacher_topk(storage, teacher_topk, "teacher_topk")
    if check_storage(storage, "storage") == EXACT:
        return {"hidden": [T, L, H]}
    final = {"hidden_final": [T, 1, H]} if k is None else {name: [T, k] for name in TEACHER_TENSORS}
    if storage == INT4:
        return {"hidden_aux": [T, L - 1, H // 2], "hidden_aux_scale": [T, L - 1, H // INT4_GROUP], **final}
    return {"hidden_aux": [T, L - 1, H], "hidden_aux_scale": [T, L - 1], **final}


def tensor_dtypes(storage: str, dtype: torch.dtype, teacher_topk: int | None = None) -> dict[str, torch.dtype]:
    """Each hidden-state tensor's dtype in a shard of this format, for states captured in ``dtype``."""
    k = check_teacher_topk(storage, teacher_topk, "teacher_topk")
    if check_storage(storage, "storage") == EXACT:
        return {"hidden": dtype}
    codes = torch.uint8 if storage == INT4 else FP8_DTYPE
    final = {"hidden_final": dtype} if k is None else {"teacher_ids": IDS_DTYPE, "teacher_logprobs": LOGPROBS_DTYPE}
    return {"hidden_aux": codes, "hidden_aux_scale": torch.bfloat16, **final}


def _divide(x: torch.Tensor, by: float) -> torch.Tensor:
    """``x / by``, a true division on every device. CUDA computes a division by a Python number as
    a product with its reciprocal, and 1/448 and 1/7 are inexact: a quotient may differ from the
    CPU's in its last bit, and so may its bf16 scale. A divisor on the tensor's device is divided by."""
    return x / torch.full((), by, dtype=x.dtype, device=x.device)


def encode(hidden: torch.Tensor, storage: str, teacher: TeacherProjection | None = None) -> dict[str, torch.Tensor]:
    """hidden [..., L, H] (capture dtype; one sample's [T, L, H] or a batch's [B, T, L, H]) as the
    tensors ``storage`` writes, on hidden's device: each token's rows are encoded on their own.
    ``teacher``: the final layer is stored as the teacher's top-k (computed on the projection's
    device) instead of as it is."""
    if check_storage(storage, "storage") == EXACT:
        if teacher is not None:
            check_teacher_topk(storage, teacher.k, "teacher_topk")
        return {"hidden": hidden}
    out = _encode_int4(hidden) if storage == INT4 else _encode_fp8(hidden)
    if teacher is None:
        out["hidden_final"] = hidden[..., -1:, :].contiguous()  # [..., 1, H]
    else:
        out["teacher_ids"], out["teacher_logprobs"] = teacher.topk(hidden[..., -1, :])  # [..., k] each
    return out


def _encode_fp8(hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """The aux layers in e4m3 with a bf16 scale per token and layer."""
    aux = hidden[..., :-1, :].float()  # [..., L-1, H]
    scale = _divide(aux.abs().amax(dim=-1), FP8_MAX).clamp_min(_TINY).to(torch.bfloat16)  # [..., L-1]
    # the amax of a row whose scale rounded down lands a hair above 448: saturated (< 0.4% off)
    q = (aux / scale.float().unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [..., L-1, H]
    return {"hidden_aux": q, "hidden_aux_scale": scale}


def _final(rows: dict[str, torch.Tensor], what: str) -> torch.Tensor:
    """The stored final layer [..., 1, H]; a clear error for rows that hold the teacher's top-k."""
    if "hidden_final" not in rows:
        raise ValueError(
            f"{what}: expected rows with the final layer (hidden_final), got the teacher's top-k in its place "
            f"({sorted(rows)}; capture.teacher_topk): read them with decode_aux and decode_teacher"
        )
    return rows["hidden_final"]


def decode(rows: dict[str, torch.Tensor], storage: str, dtype: torch.dtype, float_path: bool = False) -> torch.Tensor:
    """hidden [..., L, H] in ``dtype`` from rows of the tensors ``storage`` wrote (one sample's
    [T, ...] or a batch's [B, T, ...]), on their device. ``float_path``: the path every device
    takes, also on the CPU (the same values, but e4m3's NaN code decodes to NaN there, not to a
    number: what a check of a damaged shard must see)."""
    if check_storage(storage, "storage") == EXACT:
        return rows["hidden"]
    q, final = rows["hidden_aux"], _final(rows, "decode")
    La, H = q.shape[-2], final.shape[-1]
    out = torch.empty((*final.shape[:-2], La + 1, H), dtype=dtype, device=q.device)
    _decode_aux_into(rows, storage, out[..., :La, :], float_path)
    out[..., La:, :] = final
    return out


def decode_split(rows: dict[str, torch.Tensor], storage: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [..., L-1, H], final [..., H]) in ``dtype``: ``decode``'s values, the aux layers in a
    tensor of their own (a training batch's aux_hidden is then a view of it, not a copy)."""
    if check_storage(storage, "storage") == EXACT:
        h = rows["hidden"]
        return h[..., :-1, :], h[..., -1, :]
    final = _final(rows, "decode_split")
    return decode_aux(rows, storage, dtype), final[..., 0, :].to(dtype)


def decode_aux(rows: dict[str, torch.Tensor], storage: str, dtype: torch.dtype) -> torch.Tensor:
    """The aux layers [..., L-1, H] in ``dtype`` (``decode``'s values) from an fp8 or int4 format's
    rows, with or without a stored final layer."""
    if check_storage(storage, "storage") == EXACT:
        raise ValueError("decode_aux: expected rows of an fp8 or int4 format, got exact (use decode_split)")
    q = rows["hidden_aux"]
    H = q.shape[-1] * (2 if storage == INT4 else 1)  # int4: two codes a byte
    aux = torch.empty((*q.shape[:-1], H), dtype=dtype, device=q.device)  # [..., L-1, H]
    _decode_aux_into(rows, storage, aux)
    return aux


def decode_teacher(rows: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(teacher_ids int64 [..., k], teacher_logprobs float32 [..., k]) from rows that hold them,
    on their device: the dtypes a training step indexes and computes with."""
    return rows["teacher_ids"].to(torch.int64), rows["teacher_logprobs"].to(torch.float32)


def decodes_finite(
    rows: dict[str, torch.Tensor], storage: str, dtype: torch.dtype, vocab_size: int | None = None
) -> bool:
    """Whether every value ``rows`` decode to in ``dtype`` is finite, judged from the codes and
    scales without decoding them (True is certain; False: decode to find the value, if any). A
    decoded aux value is a code times its scale: finite when no code is NaN (e4m3fn has no Inf;
    int4 codes are integers) and the largest scale times the largest code fits ``dtype``. Rows
    with the teacher's top-k: its log-probabilities finite and its ids in [0, ``vocab_size``)
    (>= 0 when the size is not given)."""
    if check_storage(storage, "storage") == EXACT:
        return _extremes_finite(rows["hidden"])
    if "hidden_final" in rows and not _extremes_finite(rows["hidden_final"]):
        return False
    if "teacher_logprobs" in rows and not teacher_valid(rows, vocab_size):
        return False
    scale = rows["hidden_aux_scale"]
    if scale.numel() == 0:
        return True
    lo, hi = torch.aminmax(scale)
    largest = max(abs(float(lo)), abs(float(hi)))  # NaN fails the comparison below
    code_max = INT4_MAX if storage == INT4 else FP8_MAX
    if not largest * code_max <= torch.finfo(dtype).max:
        return False
    if storage == INT4:
        return True
    # e4m3fn's NaN: every exponent and mantissa bit set (0x7F, 0xFF)
    return not bool((rows["hidden_aux"].view(torch.uint8) & 0x7F).eq_(0x7F).any())


def teacher_valid(rows: dict[str, torch.Tensor], vocab_size: int | None = None) -> bool:
    """Whether the teacher's log-probabilities are finite and its ids in [0, ``vocab_size``)."""
    if not _extremes_finite(rows["teacher_logprobs"]):
        return False
    ids = rows["teacher_ids"]
    if ids.numel() == 0:
        return True
    lo, hi = torch.aminmax(ids)
    return int(lo) >= 0 and (vocab_size is None or int(hi) < int(vocab_size))


def _extremes_finite(t: torch.Tensor) -> bool:
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def _decode_aux_into(rows: dict[str, torch.Tensor], storage: str, out: torch.Tensor, float_path: bool = False) -> None:
    """The aux layers [..., L-1, H] decoded into ``out`` (its dtype), one rounding per value."""
    if storage == INT4:
        out.copy_(_int4_aux(rows["hidden_aux"], rows["hidden_aux_scale"]))
        return
    q, scale = rows["hidden_aux"], rows["hidden_aux_scale"]
    bits_path = out.dtype == torch.bfloat16 and q.device.type == "cpu" and not float_path
    if bits_path and (scale.numel() == 0 or float(scale.max()) < _BITS_SCALE_MAX):
        # sign-extended to 16 bits and shifted by 4: the sign lands on bit 15, exponent and mantissa
        # on bf16's bits 10..4; the mask clears the copies of the sign in between (bits 14..11)
        bits = q.view(torch.int8).to(torch.int16).bitwise_left_shift_(4).bitwise_and_(_BF16_FROM_E4M3)
        torch.mul(bits.view(torch.bfloat16), scale.unsqueeze(-1) * _BIAS, out=out)
    else:
        out.copy_(q.to(torch.float32).mul_(scale.float().unsqueeze(-1)))  # rounded once, to out's dtype


def _encode_int4(hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """The aux layers in 4 bits: each group of INT4_GROUP channels of a row at its own scale
    (amax / 7, rounded to bf16), codes -7..7 stored + 8, two to a byte (even channel low)."""
    *lead, L, H = hidden.shape
    g = hidden[..., :-1, :].float().reshape(*lead, L - 1, H // INT4_GROUP, INT4_GROUP)
    scale = _divide(g.abs().amax(dim=-1), INT4_MAX).clamp_min(_TINY).to(torch.bfloat16)  # [..., L-1, H/G]
    q = (g / scale.float().unsqueeze(-1)).round_().clamp_(-INT4_MAX, INT4_MAX).add_(8).to(torch.uint8)
    q = q.reshape(*lead, L - 1, H // 2, 2)
    packed = q[..., 0] | (q[..., 1] << 4)  # [..., L-1, H/2]
    return {"hidden_aux": packed, "hidden_aux_scale": scale}


def _int4_aux(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [..., L-1, H]: each code (-7..7) times its group's scale, exact."""
    *lead, La, half = packed.shape
    H = 2 * half
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).reshape(*lead, La, H // INT4_GROUP, INT4_GROUP)
    aux = (codes.to(torch.int8) - 8).to(torch.float32).mul_(scale.float().unsqueeze(-1))
    return aux.reshape(*lead, La, H)
