"""The hidden-state (capture) dtypes: the one list of what a capture may compute the states in,
by config name, and the conversions between a name and its torch.dtype. How the shards hold those
states on disk (capture.storage) is the store's: eagle3/store/storage_format.py.

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
