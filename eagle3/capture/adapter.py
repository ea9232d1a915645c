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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


class CaptureError(ValueError):
    """A capture that does not match what was asked for: names field, expected and got."""

    def __init__(self, field: str, expected: Any, got: Any, *, sample_id: str | None = None,
                 hint: str | None = None):
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


@dataclass
class CapturedSample:
    token_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # bool  [T]
    hidden: torch.Tensor  # [T, L, H] in the spec dtype, contiguous, CPU

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


# ---------------------------------------------------------------------------- helpers


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


def _is_leaf(obj: Any) -> bool:
    """A value that is data, not a container of replies."""
    return (
        isinstance(obj, (torch.Tensor, np.ndarray, bytes, bytearray, memoryview, str, int, float))
        or is_rpc_tensor(obj)
    )


# ---------------------------------------------------------------------------- RPC contract


def unwrap_rpc_replies(reply: Any, *, expected_replies: int, what: str,
                       is_reply: Callable[[Any], bool] | None = None) -> list:
    """The list of per-worker replies of a ``collective_rpc`` call, checked.

    vLLM's ``collective_rpc`` returns a list with one reply per worker, except with
    ``unique_reply_rank=r``, where it returns rank r's reply itself. A reply here is a
    container (e.g. a list of layer tensors), so the two forms differ by one level of
    nesting: ``[t0, t1, t2, t3]`` is ONE reply, ``[[t0, t1, t2, t3]]`` a list of one.

    - ``expected_replies=n > 1``: ``reply`` must be a list of n replies; a single reply
      (a list of tensors) is refused instead of letting the caller take ``[0]`` of it.
    - ``expected_replies=1``: the single reply itself or a list holding exactly it are both
      accepted (``unique_reply_rank`` or a one-worker engine); a list of several replies
      is refused.

    Returns a list of exactly ``expected_replies`` replies. ``what`` names the call in
    errors (e.g. "capture_hidden_states RPC"). By default a reply is recognised as a
    container holding data (tensors, RPC-encoded tensors, numbers, bytes) or a non-list
    object; a worker whose reply is itself a list of lists (e.g. per request, per layer)
    must pass ``is_reply`` to say what one reply looks like, or the nesting is ambiguous.
    """
    def single(obj: Any) -> bool:
        if is_reply is not None:
            return bool(is_reply(obj))
        return not isinstance(obj, (list, tuple)) or any(_is_leaf(x) for x in obj)

    if expected_replies < 1:
        raise CaptureError(f"{what}: expected_replies", "a count >= 1", expected_replies)
    field = f"{what} reply"
    if reply is None:
        raise CaptureError(field, f"{expected_replies} worker reply(ies)", "None")
    is_list = isinstance(reply, (list, tuple))
    if is_list and not reply:
        raise CaptureError(field, f"a list of {expected_replies} reply(ies)", "an empty list")
    single_form = single(reply)
    if expected_replies == 1:
        if single_form:
            return [reply]
        if len(reply) != 1:
            raise CaptureError(
                field, "a single reply (rank 0's, e.g. a list of layer tensors)",
                f"a list of {len(reply)} replies: {_describe(reply)}",
                hint="more workers replied than expected; pass expected_replies=<world size> "
                "or call collective_rpc with unique_reply_rank",
            )
        if not single(reply[0]):
            raise CaptureError(f"{field}[0]", "one worker's reply", _describe(reply[0]),
                               hint="replies nested one level deeper than expected")
        return [reply[0]]
    if single_form:
        raise CaptureError(
            field, f"a list of {expected_replies} replies (one per worker, each e.g. a list "
            f"of layer tensors)", f"a single reply: {_describe(reply)}",
            hint="collective_rpc with unique_reply_rank returns the reply itself, not a list; "
            "indexing it with [0] would keep only its first item",
        )
    if len(reply) != expected_replies:
        raise CaptureError(field, f"{expected_replies} replies", f"{len(reply)} replies: {_describe(reply)}")
    if any(r is None for r in reply):
        missing = [i for i, r in enumerate(reply) if r is None]
        raise CaptureError(field, f"{expected_replies} non-empty replies", f"None from workers {missing}")
    odd = [i for i, r in enumerate(reply) if not single(r)]
    if odd:
        raise CaptureError(f"{field}[{odd[0]}]", "one worker's reply", _describe(reply[odd[0]]),
                           hint="replies nested one level deeper than expected")
    return list(reply)


def _torch_dtype(name: str) -> torch.dtype:
    key = name.removeprefix("torch.")
    dt = getattr(torch, key, None)
    if isinstance(dt, torch.dtype):
        return dt
    try:  # vLLM encodes numpy arrays with numpy's dtype.str, e.g. "<f4"
        return torch.from_numpy(np.empty(0, dtype=np.dtype(name))).dtype
    except (TypeError, ValueError):
        raise CaptureError("rpc tensor dtype", "a torch or numpy dtype name (e.g. 'bfloat16')",
                           repr(name)) from None


def decode_rpc_tensor(obj: Any, buffers: Sequence[Any] | None = None) -> torch.Tensor:
    """A tensor from vLLM's RPC encoding ``[dtype, shape, data]``, checked.

    ``data`` is an index into ``buffers`` (the message's raw aux buffers) or the bytes
    themselves (small tensors are inlined, possibly as a msgpack ExtType). A tensor passes
    through unchanged. The buffer must hold exactly prod(shape) * itemsize bytes.
    """
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if not is_rpc_tensor(obj):
        raise CaptureError("rpc tensor", "a tensor or [dtype, shape, buffer-index] list", _describe(obj))
    dtype_name, shape, data = obj
    dtype = _torch_dtype(dtype_name)
    shape = [int(d) for d in shape]
    if isinstance(data, bool) or isinstance(data, dict):
        raise CaptureError("rpc tensor data", "a buffer index or inline bytes",
                           type(data).__name__, hint="out-of-band tensors are not supported")
    if isinstance(data, int):
        if buffers is None:
            raise CaptureError("rpc tensor data", "the message's raw buffers to index into",
                               f"buffer index {data} and no buffers",
                               hint="the engine process dropped the tensor's bytes; return "
                               "tensors through a file or connector, not RPC")
        if not 0 <= data < len(buffers):
            raise CaptureError("rpc tensor buffer index", f"0..{len(buffers) - 1}", data)
        data = buffers[data]
    if hasattr(data, "code") and hasattr(data, "data"):  # msgpack ExtType (inline raw view)
        data = data.data
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CaptureError("rpc tensor data", "bytes", type(data).__name__)
    view = memoryview(data).cast("B")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    need = math.prod(shape) * itemsize
    if view.nbytes != need:
        raise CaptureError(
            "rpc tensor buffer size", f"{need} bytes (shape {shape} x {itemsize} B of {dtype})",
            f"{view.nbytes} bytes",
        )
    if need == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(view), dtype=torch.uint8)  # own a copy: buffers get reused
    return flat.view(dtype).view(shape)


# ---------------------------------------------------------------------------- the adapter


def _as_1d(values: Any, *, field: str, sample_id: str | None) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        t = values.detach().cpu()
    elif isinstance(values, np.ndarray):
        t = torch.from_numpy(values)
    elif isinstance(values, (list, tuple)):
        try:
            t = torch.tensor(values)
        except (TypeError, ValueError):
            raise CaptureError(field, "a 1-D sequence of integers", _describe(values),
                               sample_id=sample_id) from None
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
                hint = (f"{got[0]} of the {T} prompt tokens were captured: prefix caching or "
                        "chunked prefill lost tokens")
            elif got[1] != L:
                hint = f"{got[1]} layers captured, {L} requested"
            elif got[2] != H:
                hint = f"hidden size {got[2]}, the model's is {H}"
            raise CaptureError("hidden", want, f"tensor{got}", sample_id=sample_id, hint=hint)
        return hidden
    if isinstance(hidden, (list, tuple)) and not is_rpc_tensor(hidden):
        if len(hidden) and all(isinstance(x, (list, tuple)) and not is_rpc_tensor(x) for x in hidden):
            raise CaptureError("hidden", f"a list of {L} layer tensors [T, H]",
                               f"a list of lists: {_describe(hidden)}", sample_id=sample_id,
                               hint="a list of RPC replies? unwrap it with unwrap_rpc_replies")
        bad = [i for i, x in enumerate(hidden) if not isinstance(x, (torch.Tensor, np.ndarray))]
        if bad:
            hint = ("decode RPC tensors with decode_rpc_tensor first"
                    if is_rpc_tensor(hidden[bad[0]]) else None)
            raise CaptureError(f"hidden[{bad[0]}]", "a tensor [T, H]", _describe(hidden[bad[0]]),
                               sample_id=sample_id, hint=hint)
        if len(hidden) != L:
            hint = None
            if len(hidden) == T:
                hint = "looks like one tensor per token, not one per layer"
            raise CaptureError("hidden", f"a list of {L} layer tensors (layer ids {list(spec.layer_ids)})",
                               _describe(hidden), sample_id=sample_id, hint=hint)
        parts = [torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in hidden]
        for lid, x in zip(spec.layer_ids, parts):
            if list(x.shape) != [T, H]:
                hint = None
                if x.dim() == 2 and x.shape[1] == H and x.shape[0] != T:
                    hint = f"{x.shape[0]} of the {T} prompt tokens were captured"
                raise CaptureError(f"hidden[layer {lid}]", f"[T, H] = {[T, H]}",
                                   f"tensor{list(x.shape)}", sample_id=sample_id, hint=hint)
        dtypes = {x.dtype for x in parts}
        if len(dtypes) != 1:
            raise CaptureError("hidden", "one dtype across layers", sorted(map(str, dtypes)),
                               sample_id=sample_id)
        if len({x.device for x in parts}) != 1:
            parts = [x.cpu() for x in parts]
        return torch.stack([x.detach() for x in parts], dim=1)  # on the layers' device
    hint = "decode it with decode_rpc_tensor first" if is_rpc_tensor(hidden) else None
    raise CaptureError("hidden", f"a tensor {want} or a list of {L} tensors [T, H]",
                       _describe(hidden), sample_id=sample_id, hint=hint)


def _check_finite(hidden: torch.Tensor, spec: CaptureSpec, sample_id: str | None) -> None:
    finite = torch.isfinite(hidden)
    if bool(finite.all()):
        return
    bad_per_layer = (~finite).sum(dim=(0, 2))
    nan = int(torch.isnan(hidden).sum())
    inf = int(torch.isinf(hidden).sum())
    layers = [f"layer {lid}: {int(n)}" for lid, n in zip(spec.layer_ids, bad_per_layer) if n]
    first_t = int((~finite).any(dim=(1, 2)).nonzero()[0])
    raise CaptureError("hidden", "finite values", f"{nan} NaN and {inf} Inf ({', '.join(layers)}; "
                       f"first at token {first_t}) in {spec.dtype}", sample_id=sample_id)


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


def to_captured_sample(
    hidden: Any,
    *,
    spec: CaptureSpec,
    sent_token_ids: Any,
    loss_mask: Any,
    returned_token_ids: Any = None,
    sample_id: str | None = None,
    finite_on_device: bool | None = None,
) -> CapturedSample:
    """One backend's raw capture for one request -> a checked ``CapturedSample``.

    ``hidden`` is a tensor [T, L, H] or a list of L tensors [T, H] (one per layer id, in
    ``spec.layer_ids`` order), on any device: it is cast, stacked and checked for NaN/Inf
    where it lives, and only then copied to the CPU. Anything else raises ``CaptureError``.
    ``finite_on_device``: the verdict of ``host_copy.BatchToHost``'s check on the device for
    exactly these (host-copied) values; a False verdict is explained from the host copy.
    """
    T = spec.num_tokens
    sent = _token_ids(sent_token_ids, field="sent_token_ids", sample_id=sample_id)
    if sent.shape[0] != T:
        raise CaptureError("sent_token_ids", f"{T} tokens (spec.num_tokens)", f"{sent.shape[0]} tokens",
                           sample_id=sample_id)
    if returned_token_ids is not None:
        back = _token_ids(returned_token_ids, field="returned_token_ids", sample_id=sample_id)
        if back.shape[0] != T:
            raise CaptureError("returned_token_ids", f"{T} tokens (as sent)", f"{back.shape[0]} tokens",
                               sample_id=sample_id)
        diff = (back != sent).nonzero()
        if diff.numel():
            i = int(diff[0])
            raise CaptureError("returned_token_ids", f"the sent ids (position {i}: {int(sent[i])})",
                               f"{int(back[i])} at position {i} ({diff.numel()} positions differ)",
                               sample_id=sample_id)
    mask = _as_1d(loss_mask, field="loss_mask", sample_id=sample_id)
    if mask.shape[0] != T:
        raise CaptureError("loss_mask", f"{T} entries", f"{mask.shape[0]}", sample_id=sample_id)
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
            raise CaptureError("loss_mask", "bool (or integer 0/1) values", f"{mask.dtype} values",
                               sample_id=sample_id)
        mask = mask.to(torch.bool)

    h = _stack_hidden(hidden, spec, sample_id)
    if not h.dtype.is_floating_point:
        raise CaptureError("hidden dtype", f"a floating dtype (stored as {spec.dtype})", h.dtype,
                           sample_id=sample_id, hint="integer data is not hidden states")
    # cast and check where the tensor lives (one reduction on the GPU for a GPU capture),
    # then move: CPU and GPU captures pass the same checks in the same order
    if finite_on_device is not None and (h.device.type != "cpu" or h.dtype != spec.dtype):
        raise CaptureError("hidden", f"the host copy in {spec.dtype} that the device check judged",
                           f"a {h.dtype} tensor on {h.device}", sample_id=sample_id)
    h = h.detach().to(dtype=spec.dtype)
    if finite_on_device is None:
        _check_finite(h, spec, sample_id)
    elif not finite_on_device:
        _check_finite(h, spec, sample_id)  # raises, naming layers and the first bad token
        raise CaptureError("hidden", "finite values", "NaN/Inf on the device but not in the host copy",
                           sample_id=sample_id, hint="the device-to-host copy changed the data")
    h = _to_host(h)
    return CapturedSample(token_ids=sent.contiguous(), loss_mask=mask.contiguous(), hidden=h)
