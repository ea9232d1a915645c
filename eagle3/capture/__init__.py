"""Capture: backends (hf, vllm) -> the typed adapter -> ``CapturedSample`` records.

Only the backends touch a model runtime; everything downstream sees typed records.
"""

from eagle3.capture.adapter import (
    CapturedSample,
    CaptureError,
    CaptureSpec,
    decode_rpc_tensor,
    is_rpc_tensor,
    to_captured_sample,
    unwrap_rpc_replies,
)

__all__ = [
    "CaptureError",
    "CaptureSpec",
    "CapturedSample",
    "decode_rpc_tensor",
    "is_rpc_tensor",
    "to_captured_sample",
    "unwrap_rpc_replies",
]
