"""The typed capture adapter: every backend's raw output -> one checked ``CapturedSample``.

Backends hand over hidden states in their own shape (an HF tuple, a vLLM RPC reply, a
connector file). This module is the one place that turns that into
``hidden [T, L, H]`` and refuses anything it cannot prove is right: wrong layer count,
wrong hidden size, lost tokens, different token ids, NaN/Inf. It never reshapes to make
a tensor fit — a real Kimi-K2.5 run once turned 4 layer tensors [512, 7168] into 771
slices of [512] without a crash, because a caller indexed a single RPC reply as if it
were a list of replies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from eagle3.target_model.records import CapturedSample, CaptureError, CaptureSpec, StateFormat

__all__ = ["CaptureError", "CaptureSpec", "CapturedSample", "is_rpc_tensor", "to_captured_sample", "to_encoded_sample"]


def is_rpc_tensor(obj: Any) -> bool:
    """True for vLLM's msgpack encoding of a tensor: [dtype str, shape, index | bytes]."""
    return (
        isinstance(obj, (list, tuple))
        and len(obj) == 3
        and isinstance(obj[0], str)
        and isinstance(obj[1], (list, tuple))
        and all(isinstance(d, int) and not isinstance(d, bool) for d in obj[1])
        and not isinstance(obj[2], (list, tuple, str))
    )


def _describe(obj: Any, depth: int = 0) -> str:
    """A short structural description for error messages (type, shape, length)."""
    if isinstance(obj, torch.Tensor):
        return f"tensor{list(obj.shape)} {obj.dtype}"
    if isinstance(obj, np.ndarray):
        return f"ndarray{list(obj.shape)} {obj.dtype}"
    if is_rpc_tensor(obj):
        return f"an undecoded RPC tensor [{obj[0]!r}, {list(obj[1])}, ...]"
    if isinstance(obj, (list, tuple)):
        kind = type(obj).__name__
        if not obj:
            return f"an empty {kind}"
        if depth >= 2:
            return f"a {kind} of {len(obj)}"
        first = _describe(obj[0], depth + 1)
        same = all(type(x) is type(obj[0]) for x in obj)
        return f"a {kind} of {len(obj)} items (first: {first}{'' if same else ', mixed types'})"
    return type(obj).__name__


def _as_1d(values: Any, *, field: str, sample_id: str | None) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        t = values.detach().cpu()
    elif isinstance(values, np.ndarray):
        t = torch.from_numpy(values)
    elif isinstance(values, (list, tuple)):
        try:
            t = torch.tensor(values)
        except (TypeError, ValueError):
            raise CaptureError(field, "a 1-D sequence of integers", _describe(values), sample_id=sample_id) from None
    else:
        raise CaptureError(field, "a 1-D tensor or list", _describe(values), sample_id=sample_id)
    if t.dim() != 1:
        raise CaptureError(field, "a 1-D tensor [T]", f"shape {list(t.shape)}", sample_id=sample_id)
    return t


def _token_ids(values: Any, *, field: str, sample_id: str | None) -> torch.Tensor:
    t = _as_1d(values, field=field, sample_id=sample_id)
    if t.numel() and (t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex()):
        raise CaptureError(field, "integer token ids", t.dtype, sample_id=sample_id)
    return t.to(torch.int64)


def _stack_hidden(hidden: Any, spec: CaptureSpec, sample_id: str | None) -> torch.Tensor:
    """[T, L, H] from a tensor or a list of L [T, H] tensors; anything else is refused."""
    T, L, H = spec.shape
    want = f"[T, L, H] = {[T, L, H]} (layer ids {list(spec.layer_ids)})"
    if isinstance(hidden, np.ndarray):
        hidden = torch.from_numpy(hidden)
    if isinstance(hidden, torch.Tensor):
        got = list(hidden.shape)
        if hidden.dim() != 3:
            hint = None
            if hidden.dim() == 1 and hidden.numel() == T * L * H:
                hint = "a flat tensor is never reshaped: its layout is unknown"
            elif hidden.dim() == 2 and got == [T, H] and L != 1:
                hint = f"only one layer's state; {L} layers were requested"
            raise CaptureError("hidden", want, f"tensor{got}", sample_id=sample_id, hint=hint)
        if got != [T, L, H]:
            hint = None
            if got == [L, T, H]:
                hint = "looks like [L, T, H]: the backend must stack layers on dim 1"
            elif got[0] != T and got[1:] == [L, H]:
                hint = f"{got[0]} of the {T} prompt tokens were captured: prefix caching or chunked prefill lost tokens"
            elif got[1] != L:
                hint = f"{got[1]} layers captured, {L} requested"
            elif got[2] != H:
                hint = f"hidden size {got[2]}, the model's is {H}"
            raise CaptureError("hidden", want, f"tensor{got}", sample_id=sample_id, hint=hint)
        return hidden
    if isinstance(hidden, (list, tuple)) and not is_rpc_tensor(hidden):
        if len(hidden) and all(isinstance(x, (list, tuple)) and not is_rpc_tensor(x) for x in hidden):
            raise CaptureError(
                "hidden",
                f"a list of {L} layer tensors [T, H]",
                f"a list of lists: {_describe(hidden)}",
                sample_id=sample_id,
                hint="a list of RPC replies? pass one reply's layer tensors",
            )
        bad = [i for i, x in enumerate(hidden) if not isinstance(x, (torch.Tensor, np.ndarray))]
        if bad:
            hint = "decode the RPC tensors to tensors first" if is_rpc_tensor(hidden[bad[0]]) else None
            raise CaptureError(
                f"hidden[{bad[0]}]", "a tensor [T, H]", _describe(hidden[bad[0]]), sample_id=sample_id, hint=hint
            )
        if len(hidden) != L:
            hint = None
            if len(hidden) == T:
                hint = "looks like one tensor per token, not one per layer"
            raise CaptureError(
                "hidden",
                f"a list of {L} layer tensors (layer ids {list(spec.layer_ids)})",
                _describe(hidden),
                sample_id=sample_id,
                hint=hint,
            )
        parts = [torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in hidden]
        for lid, x in zip(spec.layer_ids, parts):
            if list(x.shape) != [T, H]:
                hint = None
                if x.dim() == 2 and x.shape[1] == H and x.shape[0] != T:
                    hint = f"{x.shape[0]} of the {T} prompt tokens were captured"
                raise CaptureError(
                    f"hidden[layer {lid}]",
                    f"[T, H] = {[T, H]}",
                    f"tensor{list(x.shape)}",
                    sample_id=sample_id,
                    hint=hint,
                )
        dtypes = {x.dtype for x in parts}
        if len(dtypes) != 1:
            raise CaptureError("hidden", "one dtype across layers", sorted(map(str, dtypes)), sample_id=sample_id)
        if len({x.device for x in parts}) != 1:
            parts = [x.cpu() for x in parts]
        return torch.stack([x.detach() for x in parts], dim=1)  # on the layers' device
    hint = "decode the RPC tensor to a tensor first" if is_rpc_tensor(hidden) else None
    raise CaptureError(
        "hidden", f"a tensor {want} or a list of {L} tensors [T, H]", _describe(hidden), sample_id=sample_id, hint=hint
    )


def check_hidden_finite(hidden: torch.Tensor, spec: CaptureSpec, sample_id: str | None = None) -> None:
    """CaptureError naming the layers and the first token holding a NaN or an Inf, if any. The
    extremes first, as the store's reader does: a NaN propagates into them and an Inf is one, in
    a pass that builds no [T, L, H] mask (bench/finite_check.py measures it against the mask);
    only a bad sample pays for the mask that locates the values."""
    if hidden.numel() == 0:
        return
    lo, hi = torch.aminmax(hidden)
    if bool(torch.isfinite(lo)) and bool(torch.isfinite(hi)):
        return
    finite = torch.isfinite(hidden)
    bad_per_layer = (~finite).sum(dim=(0, 2))
    nan = int(torch.isnan(hidden).sum())
    inf = int(torch.isinf(hidden).sum())
    layers = [f"layer {lid}: {int(n)}" for lid, n in zip(spec.layer_ids, bad_per_layer) if n]
    first_t = int((~finite).any(dim=(1, 2)).nonzero()[0])
    raise CaptureError(
        "hidden",
        "finite values",
        f"{nan} NaN and {inf} Inf ({', '.join(layers)}; first at token {first_t}) in {spec.dtype}",
        sample_id=sample_id,
    )


def _to_host(h: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy. From CUDA: into pinned memory (torch's caching host allocator
    recycles the blocks once records are written and freed), a DMA copy, then wait for it,
    so the caller never sees bytes still in flight."""
    if h.device.type == "cpu":
        return h.contiguous()
    if h.device.type != "cuda":
        return h.to("cpu").contiguous()
    out = torch.empty(h.shape, dtype=h.dtype, pin_memory=True)
    out.copy_(h, non_blocking=True)
    torch.cuda.current_stream(h.device).synchronize()
    return out


def _checked_tokens(
    spec: CaptureSpec, sent_token_ids: Any, loss_mask: Any, returned_token_ids: Any, sample_id: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids int64 [T], loss mask bool [T]), checked: T as sent, the ids the backend returns
    equal to those sent, the mask 0/1."""
    T = spec.num_tokens
    sent = _token_ids(sent_token_ids, field="sent_token_ids", sample_id=sample_id)
    if sent.shape[0] != T:
        raise CaptureError(
            "sent_token_ids", f"{T} tokens (spec.num_tokens)", f"{sent.shape[0]} tokens", sample_id=sample_id
        )
    if returned_token_ids is not None:
        back = _token_ids(returned_token_ids, field="returned_token_ids", sample_id=sample_id)
        if back.shape[0] != T:
            raise CaptureError(
                "returned_token_ids", f"{T} tokens (as sent)", f"{back.shape[0]} tokens", sample_id=sample_id
            )
        diff = (back != sent).nonzero()
        if diff.numel():
            i = int(diff[0])
            raise CaptureError(
                "returned_token_ids",
                f"the sent ids (position {i}: {int(sent[i])})",
                f"{int(back[i])} at position {i} ({diff.numel()} positions differ)",
                sample_id=sample_id,
            )
    mask = _as_1d(loss_mask, field="loss_mask", sample_id=sample_id)
    if mask.shape[0] != T:
        raise CaptureError("loss_mask", f"{T} entries", f"{mask.shape[0]}", sample_id=sample_id)
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
            raise CaptureError("loss_mask", "bool (or integer 0/1) values", f"{mask.dtype} values", sample_id=sample_id)
        mask = mask.to(torch.bool)
    return sent, mask


def to_captured_sample(
    hidden: Any,
    *,
    spec: CaptureSpec,
    sent_token_ids: Any,
    loss_mask: Any,
    returned_token_ids: Any = None,
    sample_id: str | None = None,
    finite_on_device: bool | None = None,
    keep_device: bool = False,
) -> CapturedSample:
    """One backend's raw capture for one request -> a checked ``CapturedSample``.

    ``hidden`` is a tensor [T, L, H] or a list of L tensors [T, H] (one per layer id, in
    ``spec.layer_ids`` order), on any device: it is cast, stacked and checked for NaN/Inf
    where it lives, and only then copied to the CPU. Anything else raises ``CaptureError``.
    ``finite_on_device``: the verdict of ``host_copy.BatchToHost``'s check on the device for
    exactly these (host-copied) values; a False verdict is explained from the host copy.
    ``keep_device``: the checked hidden states stay where they are (online training feeds them
    to the head on the same device); token ids and mask are on the CPU either way.
    """
    sent, mask = _checked_tokens(spec, sent_token_ids, loss_mask, returned_token_ids, sample_id)
    h = _stack_hidden(hidden, spec, sample_id)
    if not h.dtype.is_floating_point:
        raise CaptureError(
            "hidden dtype",
            f"a floating dtype (stored as {spec.dtype})",
            h.dtype,
            sample_id=sample_id,
            hint="integer data is not hidden states",
        )
    # cast and check where the tensor lives (one reduction on the GPU for a GPU capture),
    # then move: CPU and GPU captures pass the same checks in the same order
    if finite_on_device is not None and (h.device.type != "cpu" or h.dtype != spec.dtype):
        raise CaptureError(
            "hidden",
            f"the host copy in {spec.dtype} that the device check judged",
            f"a {h.dtype} tensor on {h.device}",
            sample_id=sample_id,
        )
    h = h.detach().to(dtype=spec.dtype)
    if finite_on_device is None:
        check_hidden_finite(h, spec, sample_id)
    elif not finite_on_device:
        check_hidden_finite(h, spec, sample_id)  # raises, naming layers and the first bad token
        raise CaptureError(
            "hidden",
            "finite values",
            "NaN/Inf on the device but not in the host copy",
            sample_id=sample_id,
            hint="the device-to-host copy changed the data",
        )
    if not keep_device:
        h = _to_host(h)
    return CapturedSample(token_ids=sent.contiguous(), loss_mask=mask.contiguous(), hidden=h)


def to_encoded_sample(
    encoded: dict[str, torch.Tensor],
    *,
    storage: StateFormat,
    spec: CaptureSpec,
    sent_token_ids: Any,
    loss_mask: Any,
    finite_on_device: bool,
    returned_token_ids: Any = None,
    sample_id: str | None = None,
) -> CapturedSample:
    """A record whose states were encoded in ``storage`` on the capture device and copied to the
    host as that format's tensors (``host_copy.BatchToHost`` with a ``DeviceEncoding``). The tokens
    pass ``to_captured_sample``'s checks; the states were judged finite on the device, before the
    encode, and each tensor must hold T rows on the host (the writer checks their shapes and
    dtypes against the dataset's)."""
    sent, mask = _checked_tokens(spec, sent_token_ids, loss_mask, returned_token_ids, sample_id)
    if not finite_on_device:
        raise CaptureError(
            "hidden",
            "finite values",
            f"NaN/Inf in {spec.dtype} on the device (judged before the {storage} encode)",
            sample_id=sample_id,
        )
    for name, t in encoded.items():
        if t.device.type != "cpu" or t.dim() < 1 or t.shape[0] != spec.num_tokens:
            raise CaptureError(
                f"encoded {name}",
                f"a host tensor of {spec.num_tokens} rows",
                f"tensor{list(t.shape)} on {t.device}",
                sample_id=sample_id,
            )
    return CapturedSample(
        token_ids=sent.contiguous(), loss_mask=mask.contiguous(), hidden=None, encoded=dict(encoded), storage=storage
    )
