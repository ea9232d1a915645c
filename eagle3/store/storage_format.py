"""How a shard holds the hidden states: the on-disk format, one value (``StorageFormat``), built
once from the config keys users type (``capture.storage``: exact | fp8 | int4, and
``capture.teacher_topk``) or read back from a manifest, and distinct from the capture dtype (what
the target computes the states in, and what a reader gets back).

    exact   hidden [T, L, H] in the capture dtype: the states as captured.
    fp8     hidden_aux [T, L-1, H] float8_e4m3fn + hidden_aux_scale [T, L-1] bfloat16: the aux
            layers (every id but the last; eagle3/store/aux_codes.py has the codes);
            hidden_final [T, 1, H] in the capture dtype: the last id, the target's final state.
    int4    hidden_aux [T, L-1, H/2] uint8 + hidden_aux_scale [T, L-1, H/32] bfloat16 (an option,
            not a default), hidden_final as fp8's.

The final layer stays exact because it is the state the trainer turns into the teacher's
distribution (lm_head of it gives p_t, the target's next-token probabilities the head learns):
an error there moves the labels themselves, while an error in the aux layers is only noise in
the head's input. It costs H x 2 bytes of the (L-1) x H + H x 2 per token (SmolLM2, L=4: 0.63x of
bf16 in all; fp8 everywhere would be 0.5x). docs/architecture.md (dataset format) gives the
figures measured for both.

With ``teacher_topk`` k (fp8 or int4 only), ``hidden_final`` is not stored: in its place
``teacher_ids`` int32 [T, k] and ``teacher_logprobs`` float16 [T, k], the target's k most likely
next tokens (eagle3/store/teacher_topk.py). Such rows have no final layer to decode:
``decode_aux`` and ``decode_teacher`` read them, and ``decode`` / ``decode_split`` refuse them.

Encode and decode run on whatever device holds the tensors, with any leading dims ([T, L, H] or a
batch [B, T, L, H]: every token is encoded on its own), and give the same bits on each: a GPU
capture encodes before its copy to the host (eagle3/target_model/host_copy.py); a GPU training
step decodes its batch after the copy to the device (``decode_split``) into the values a loader
worker's ``decode`` gives; ``decodes_finite`` finds e4m3's NaN code in a damaged shard.

A dataset's identity names the format only when it is not exact (``fingerprint_inputs``), and a
shard's metadata the same way (``to_metadata``): the datasets and shards written before the
format existed keep their names and bytes. The manifest holds it as two keys, ``storage`` and
``teacher_topk`` (``to_manifest`` / ``from_manifest``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from eagle3.store import aux_codes
from eagle3.store.aux_codes import FP8_DTYPE, FP8_MAX, INT4_GROUP, INT4_MAX
from eagle3.store.teacher_topk import IDS_DTYPE, LOGPROBS_DTYPE, TEACHER_TENSORS, TeacherProjection

EXACT, FP8, INT4 = "exact", "fp8", "int4"
STORAGES = (EXACT, FP8, INT4)
_SCALE_BYTES = 2  # one bf16 scale per token and aux layer (int4: per group of INT4_GROUP channels)
# the teacher's top-k in place of the final layer: an int32 id and a float16 log-probability each
TEACHER_ID_BYTES, TEACHER_LOGPROB_BYTES = IDS_DTYPE.itemsize, LOGPROBS_DTYPE.itemsize

__all__ = [
    "EXACT",
    "FP8",
    "FP8_MAX",
    "INT4",
    "INT4_GROUP",
    "STORAGES",
    "StorageFormat",
    "decode_teacher",
    "teacher_valid",
]


@dataclass(frozen=True)
class StorageFormat:
    """The shards' on-disk format: ``kind`` (capture.storage) and ``teacher_topk``
    (capture.teacher_topk: k ids and log-probabilities in place of the final layer; None keeps
    the layer). Checked once, here: every value that exists is a format a shard can hold."""

    kind: str = EXACT
    teacher_topk: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in STORAGES:
            raise ValueError(f"capture.storage: expected one of {list(STORAGES)}, got {self.kind!r}")
        k = self.teacher_topk
        if k is None:
            return
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"capture.teacher_topk: expected null or an integer >= 1, got {k!r}")
        if self.kind == EXACT:
            raise ValueError(
                "capture.teacher_topk: expected null with capture.storage=exact (the top-k replaces the final "
                f"layer of an fp8 or int4 shard; exact stores every layer as captured), got {k}"
            )

    # ------------------------------------------------------------------ naming and round trips

    @classmethod
    def from_config(cls, capture: Any) -> StorageFormat:
        """The format a capture config group asks for (its ``storage`` and ``teacher_topk``)."""
        return cls(capture.storage, capture.teacher_topk)

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's two keys, in their order."""
        return {"storage": self.kind, "teacher_topk": self.teacher_topk}

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> StorageFormat:
        """The format a manifest's keys name; one written before the keys existed is exact."""
        return cls(raw.get("storage", EXACT), raw.get("teacher_topk"))

    def fingerprint_inputs(self) -> dict[str, Any]:
        """What a dataset's identity holds of the format: nothing for exact (the datasets named
        before the format existed keep their names), and the top-k only when set (a dataset with
        the teacher's top-k is another dataset than one with the final layer)."""
        out: dict[str, Any] = {} if self.is_exact else {"storage": self.kind}
        return out if self.teacher_topk is None else out | {"teacher_topk": self.teacher_topk}

    def to_metadata(self) -> dict[str, str]:
        """A shard's metadata keys of the format (``fingerprint_inputs`` as strings): exact shards
        carry none, and shards with the final layer no teacher_topk: as written before the keys."""
        return {key: str(value) for key, value in self.fingerprint_inputs().items()}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> StorageFormat:
        """The format a shard's metadata names (``to_metadata``'s inverse)."""
        k = meta.get("teacher_topk")
        if k is not None and not k.isdigit():
            raise ValueError(f"teacher_topk: expected the digits of an integer >= 1, got {k!r}")
        return cls(meta.get("storage", EXACT), None if k is None else int(k))

    def __str__(self) -> str:
        """``exact``, ``fp8``, ``fp8+top32``."""
        return self.kind if self.teacher_topk is None else f"{self.kind}+top{self.teacher_topk}"

    @property
    def is_exact(self) -> bool:
        return self.kind == EXACT

    # ------------------------------------------------------------------ sizes

    def check_width(self, hidden_size: int) -> str | None:
        """Why this format cannot hold states of this width (None: it can)."""
        if self.kind == INT4 and int(hidden_size) % INT4_GROUP:
            return f"int4 groups {INT4_GROUP} channels: expected a hidden size divisible by it, got {hidden_size}"
        return None

    def tensor_names(self) -> tuple[str, ...]:
        """The hidden-state tensors a shard holds (beside input_ids, loss_mask, offsets)."""
        if self.is_exact:
            return ("hidden",)
        return (
            "hidden_aux",
            "hidden_aux_scale",
            *(("hidden_final",) if self.teacher_topk is None else TEACHER_TENSORS),
        )

    def tensor_shapes(self, num_tokens: int, num_layers: int, hidden_size: int) -> dict[str, list[int]]:
        """Each hidden-state tensor's shape in a shard of ``num_tokens`` tokens."""
        T, L, H, k = int(num_tokens), int(num_layers), int(hidden_size), self.teacher_topk
        if self.is_exact:
            return {"hidden": [T, L, H]}
        final = {"hidden_final": [T, 1, H]} if k is None else {name: [T, k] for name in TEACHER_TENSORS}
        if self.kind == INT4:
            return {"hidden_aux": [T, L - 1, H // 2], "hidden_aux_scale": [T, L - 1, H // INT4_GROUP], **final}
        return {"hidden_aux": [T, L - 1, H], "hidden_aux_scale": [T, L - 1], **final}

    def tensor_dtypes(self, dtype: torch.dtype) -> dict[str, torch.dtype]:
        """Each hidden-state tensor's dtype, for states captured in ``dtype``."""
        if self.is_exact:
            return {"hidden": dtype}
        codes = torch.uint8 if self.kind == INT4 else FP8_DTYPE
        k = self.teacher_topk
        final = {"hidden_final": dtype} if k is None else {"teacher_ids": IDS_DTYPE, "teacher_logprobs": LOGPROBS_DTYPE}
        return {"hidden_aux": codes, "hidden_aux_scale": torch.bfloat16, **final}

    def bytes_per_token(self, num_layers: int, hidden_size: int, itemsize: int) -> int:
        """Bytes of hidden state one token of ``num_layers`` layers of width ``hidden_size``
        (captured at ``itemsize`` bytes a value) takes on disk; ids, masks and headers not included."""
        L, H, k = int(num_layers), int(hidden_size), self.teacher_topk
        if self.is_exact:
            return L * H * int(itemsize)
        # the final layer exact, or the teacher's top-k in its place
        final = H * int(itemsize) if k is None else k * (TEACHER_ID_BYTES + TEACHER_LOGPROB_BYTES)
        if self.kind == INT4:  # two codes a byte + a scale per group
            return (L - 1) * (-(-H // 2) + _SCALE_BYTES * -(-H // INT4_GROUP)) + final
        return (L - 1) * (H + _SCALE_BYTES) + final  # fp8 aux + scales

    def layout(self, dtype: str, num_layers: int, hidden_size: int) -> str:
        """The tensors a token's states take in words, for states captured in ``dtype`` (its name)."""
        L, H, k = int(num_layers), int(hidden_size), self.teacher_topk
        if self.is_exact:
            return f"exact: hidden {dtype} [T, {L}, {H}]"
        final = f"final {dtype} [T, 1, {H}]"
        if k is not None:
            final = f"teacher top-{k}: ids int32 [T, {k}] + log-probabilities float16 [T, {k}] (no final layer)"
        if self.kind == INT4:
            G = INT4_GROUP
            return (
                f"int4: aux uint8 [T, {L - 1}, {H // 2}] (2 codes a byte) + bfloat16 scale per {G} channels "
                f"[T, {L - 1}, {H // G}], {final}"
            )
        return f"fp8: aux float8_e4m3fn [T, {L - 1}, {H}] + bfloat16 scale [T, {L - 1}], {final}"

    # ------------------------------------------------------------------ encode and decode

    def encode(self, hidden: torch.Tensor, teacher: TeacherProjection | None = None) -> dict[str, torch.Tensor]:
        """hidden [..., L, H] (capture dtype; one sample's [T, L, H] or a batch's [B, T, L, H]) as
        the tensors this format writes, on hidden's device: each token's rows encoded on their own.
        ``teacher``: the target's projection that gives the top-k (computed on its device); needed
        exactly when the format stores the top-k in place of the final layer."""
        if (teacher.k if teacher is not None else None) != self.teacher_topk:
            got = "none" if teacher is None else f"k={teacher.k}"
            raise ValueError(f"encode: teacher: expected a projection with k={self.teacher_topk} for {self}, got {got}")
        if self.is_exact:
            return {"hidden": hidden}
        out = aux_codes.encode_int4(hidden) if self.kind == INT4 else aux_codes.encode_fp8(hidden)
        if teacher is None:
            out["hidden_final"] = hidden[..., -1:, :].contiguous()  # [..., 1, H]
        else:
            out["teacher_ids"], out["teacher_logprobs"] = teacher.topk(hidden[..., -1, :])  # [..., k] each
        return out

    def decode(self, rows: Mapping[str, torch.Tensor], dtype: torch.dtype, float_path: bool = False) -> torch.Tensor:
        """hidden [..., L, H] in ``dtype`` from rows of the tensors this format wrote (one sample's
        [T, ...] or a batch's [B, T, ...]), on their device. ``float_path``: the path every device
        takes, also on the CPU (the same values, but e4m3's NaN code decodes to NaN there, not to a
        number: what a check of a damaged shard must see)."""
        if self.is_exact:
            return rows["hidden"]
        q, final = rows["hidden_aux"], _final(rows, "decode")
        La, H = q.shape[-2], final.shape[-1]
        out = torch.empty((*final.shape[:-2], La + 1, H), dtype=dtype, device=q.device)
        self._decode_aux_into(rows, out[..., :La, :], float_path)
        out[..., La:, :] = final
        return out

    def decode_split(self, rows: Mapping[str, torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [..., L-1, H], final [..., H]) in ``dtype``: ``decode``'s values, the aux layers in a
        tensor of their own (a training batch's aux_hidden is then a view of it, not a copy)."""
        if self.is_exact:
            h = rows["hidden"]
            return h[..., :-1, :], h[..., -1, :]
        final = _final(rows, "decode_split")
        return self.decode_aux(rows, dtype), final[..., 0, :].to(dtype)

    def decode_aux(self, rows: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The aux layers [..., L-1, H] in ``dtype`` (``decode``'s values) from an fp8 or int4
        format's rows, with or without a stored final layer."""
        if self.is_exact:
            raise ValueError("decode_aux: expected rows of an fp8 or int4 format, got exact (use decode_split)")
        q = rows["hidden_aux"]
        H = q.shape[-1] * (2 if self.kind == INT4 else 1)  # int4: two codes a byte
        aux = torch.empty((*q.shape[:-1], H), dtype=dtype, device=q.device)  # [..., L-1, H]
        self._decode_aux_into(rows, aux)
        return aux

    def _decode_aux_into(self, rows: Mapping[str, torch.Tensor], out: torch.Tensor, float_path: bool = False) -> None:
        if self.kind == INT4:
            out.copy_(aux_codes.decode_int4(rows["hidden_aux"], rows["hidden_aux_scale"]))
        else:
            aux_codes.decode_fp8_into(rows["hidden_aux"], rows["hidden_aux_scale"], out, float_path)

    def decodes_finite(
        self, rows: Mapping[str, torch.Tensor], dtype: torch.dtype, vocab_size: int | None = None
    ) -> bool:
        """Whether every value ``rows`` decode to in ``dtype`` is finite, judged from the codes and
        scales without decoding them (True is certain; False: decode to find the value, if any). A
        decoded aux value is a code times its scale: finite when no code is NaN (e4m3fn has no Inf;
        int4 codes are integers) and the largest scale times the largest code fits ``dtype``. Rows
        with the teacher's top-k: its log-probabilities finite and its ids in [0, ``vocab_size``)
        (>= 0 when the size is not given)."""
        if self.is_exact:
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
        code_max = INT4_MAX if self.kind == INT4 else FP8_MAX
        if not largest * code_max <= torch.finfo(dtype).max:
            return False
        return self.kind == INT4 or not aux_codes.fp8_has_nan(rows["hidden_aux"])


def decode_teacher(rows: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(teacher_ids int64 [..., k], teacher_logprobs float32 [..., k]) from rows that hold them,
    on their device: the dtypes a training step indexes and computes with."""
    return rows["teacher_ids"].to(torch.int64), rows["teacher_logprobs"].to(torch.float32)


def teacher_valid(rows: Mapping[str, torch.Tensor], vocab_size: int | None = None) -> bool:
    """Whether the teacher's log-probabilities are finite and its ids in [0, ``vocab_size``)."""
    if not _extremes_finite(rows["teacher_logprobs"]):
        return False
    ids = rows["teacher_ids"]
    if ids.numel() == 0:
        return True
    lo, hi = torch.aminmax(ids)
    return int(lo) >= 0 and (vocab_size is None or int(hi) < int(vocab_size))


def _final(rows: Mapping[str, torch.Tensor], what: str) -> torch.Tensor:
    """The stored final layer [..., 1, H]; a clear error for rows that hold the teacher's top-k."""
    if "hidden_final" not in rows:
        raise ValueError(
            f"{what}: expected rows with the final layer (hidden_final), got the teacher's top-k in its place "
            f"({sorted(rows)}; capture.teacher_topk): read them with decode_aux and decode_teacher"
        )
    return rows["hidden_final"]


def _extremes_finite(t: torch.Tensor) -> bool:
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))
