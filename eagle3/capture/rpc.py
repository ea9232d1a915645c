"""vLLM's RPC boundary: replies of ``collective_rpc`` and tensors in msgpack form.

``collective_rpc(..., unique_reply_rank=0)`` returns rank 0's reply itself, not a list of
replies; indexing it as a list kept one layer of four in a real Kimi-K2.5 run, without a
crash. Tensors crossing vLLM's engine process arrive as ``[dtype, shape, buffer-index]``
lists. These helpers turn both into plain values or refuse, naming what they got.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from eagle3.capture.records import CaptureError


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
