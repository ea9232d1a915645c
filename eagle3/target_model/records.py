"""The typed records of a capture: what was asked (``CaptureSpec``), what comes back
(``CapturedSample``), and the one error every mismatch raises (``CaptureError``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

# The file vLLM's hidden-state connector (ExampleHiddenStatesConnector) writes per request, read
# by capture_vllm.py and written the same way by vllm_internals.py's host-copy connector:
# hidden_states [T, L, H] (capture ids in ascending order), token_ids int64 [T]; "<file>.lock"
# is held exclusively until the file is whole.
CONNECTOR_HIDDEN_KEY, CONNECTOR_TOKENS_KEY = "hidden_states", "token_ids"


class CaptureError(ValueError):
    """A capture that does not match what was asked for: names field, expected and got."""

    def __init__(self, field: str, expected: Any, got: Any, *, sample_id: str | None = None, hint: str | None = None):
        self.field = field
        self.expected = expected
        self.got = got
        self.sample_id = sample_id
        self.hint = hint
        where = f"sample {sample_id!r}: " if sample_id is not None else ""
        msg = f"{where}{field}: expected {expected}, got {got}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


@dataclass(frozen=True)
class CaptureSpec:
    """What one request's capture must look like."""

    layer_ids: tuple[int, ...]  # vLLM numbering: aux ids + N
    hidden_size: int
    dtype: torch.dtype  # stored dtype
    num_tokens: int  # prompt length T that was sent

    def __post_init__(self):
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))
        if not self.layer_ids:
            raise CaptureError("CaptureSpec.layer_ids", "at least one layer id", "()")
        if not self.dtype.is_floating_point:
            raise CaptureError("CaptureSpec.dtype", "a floating dtype", self.dtype)

    @property
    def num_layers(self) -> int:
        return len(self.layer_ids)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_tokens, self.num_layers, self.hidden_size)


class StateFormat(Protocol):
    """The store's on-disk format (eagle3/store/storage_format.py ``StorageFormat``) as a capture
    carries it: the target model does not import the store. Its str names it (``fp8+top32``)."""

    @property
    def is_exact(self) -> bool: ...


@dataclass(frozen=True)
class DeviceEncoding:
    """A capture on a GPU stores its states in ``storage`` (capture.storage: fp8, int4) before they
    leave the device: ``encode`` maps hidden [..., L, H] to that format's tensors on their device.
    The math is the store's (``StorageFormat.encode``), handed in by extraction: the target model
    does not import the store."""

    storage: StateFormat
    encode: Callable[[torch.Tensor], dict[str, torch.Tensor]]

    def __post_init__(self):
        if self.storage.is_exact:
            raise CaptureError("DeviceEncoding.storage", "a format other than exact (fp8, int4)", self.storage)


@dataclass
class CapturedSample:
    token_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # bool  [T]
    # [T, L, H] in the spec dtype, contiguous; CPU unless kept on the device. None when the states
    # came to the host already encoded (``encoded``)
    hidden: torch.Tensor | None
    # the states in ``storage``'s tensors (each [T, ...], on the host), encoded on the capture device
    # (None: the states came as captured, in ``hidden``)
    encoded: dict[str, torch.Tensor] | None = None
    storage: StateFormat | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    def states(self) -> torch.Tensor:
        """hidden [T, L, H]; a CaptureError for a record whose states came encoded (``encoded``)."""
        if self.hidden is None:
            raise CaptureError("CapturedSample.hidden", "the states as captured", f"only their {self.storage} encoding")
        return self.hidden
