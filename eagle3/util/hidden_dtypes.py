"""The hidden-state (capture) dtypes: the one list of what a capture may store, by config name,
and the conversions between a name and its torch.dtype.

torch is imported only inside the functions: eagle3.planning.disk_estimate checks names while a config composes,
and composing a config stays light.
"""

from __future__ import annotations

from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HIDDEN_DTYPES = ("bfloat16", "float16", "float32")  # config names, each also torch's own name


def check_name(name: str, key: str = "capture.dtype", hint: str | None = None) -> str:
    """``name`` as a str if it is a supported hidden dtype, else a ValueError naming ``key``,
    the expected names and what it got (plus ``hint`` in parentheses)."""
    if str(name) not in HIDDEN_DTYPES:
        msg = f"{key}: expected one of {list(HIDDEN_DTYPES)}, got {name!r}"
        raise ValueError(f"{msg} ({hint})" if hint else msg)
    return str(name)


def torch_dtype(name: str, key: str = "capture.dtype") -> torch.dtype:
    """The torch.dtype of a config name; the error is check_name's."""
    import torch

    return getattr(torch, check_name(name, key))


@cache
def names_by_torch_dtype() -> MappingProxyType[torch.dtype, str]:
    """Every supported torch.dtype -> its config name, in HIDDEN_DTYPES' order."""
    import torch

    return MappingProxyType({getattr(torch, name): name for name in HIDDEN_DTYPES})


# How the captured states lie on disk (capture.storage), distinct from the capture dtype (what the
# target computes them in): "exact" stores hidden [T, L, H] in the capture dtype; "fp8" stores the
# aux layers as float8_e4m3fn with one bf16 scale per token and layer, and the final layer (its
# state gives the teacher's distribution) exact in the capture dtype (eagle3/store/storage_format.py).
# "int4" (an option, not a default): the aux layers in 4 bits with a bf16 scale per 32 channels.
EXACT, FP8, INT4 = "exact", "fp8", "int4"
STORAGES = (EXACT, FP8, INT4)
_SCALE_BYTES = 2  # one bf16 scale per token and aux layer (int4: per group of INT4_GROUP channels)
INT4_GROUP = 32


def check_storage(name: str, key: str = "capture.storage") -> str:
    """``name`` as a str if it is a storage format, else a ValueError naming ``key``."""
    if str(name) not in STORAGES:
        raise ValueError(f"{key}: expected one of {list(STORAGES)}, got {name!r}")
    return str(name)


# capture.teacher_topk: in place of the final layer, the target's k most likely next tokens at each
# position, an int32 id and a float16 log-probability each (eagle3/store/teacher_topk.py)
TEACHER_ID_BYTES, TEACHER_LOGPROB_BYTES = 4, 2


def check_teacher_topk(storage: str, teacher_topk: int | None, key: str = "capture.teacher_topk") -> int | None:
    """``teacher_topk`` as an int (or None: the final layer kept exact), else a ValueError naming
    ``key``: k needs a format that stores the final layer apart from the aux layers (fp8, int4)."""
    if teacher_topk is None:
        return None
    if isinstance(teacher_topk, bool) or not isinstance(teacher_topk, int) or teacher_topk < 1:
        raise ValueError(f"{key}: expected null or an integer >= 1, got {teacher_topk!r}")
    if check_storage(storage) == EXACT:
        raise ValueError(
            f"{key}: expected null with capture.storage=exact (the top-k replaces the final layer of an "
            f"fp8 or int4 shard; exact stores every layer as captured), got {teacher_topk}"
        )
    return int(teacher_topk)


def hidden_bytes_per_token(
    storage: str, num_layers: int, hidden_size: int, itemsize: int, teacher_topk: int | None = None
) -> int:
    """Bytes of hidden state one token takes on disk (ids, masks and headers not included)."""
    L, H = int(num_layers), int(hidden_size)
    if check_storage(storage) == EXACT:
        return L * H * int(itemsize)
    k = check_teacher_topk(storage, teacher_topk)
    # the final layer exact, or the teacher's top-k in its place
    final = H * int(itemsize) if k is None else k * (TEACHER_ID_BYTES + TEACHER_LOGPROB_BYTES)
    if storage == INT4:  # two codes a byte + a scale per group
        return (L - 1) * (-(-H // 2) + _SCALE_BYTES * -(-H // INT4_GROUP)) + final
    return (L - 1) * (H + _SCALE_BYTES) + final  # fp8 aux + scales
