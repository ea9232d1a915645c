"""The files vLLM's hidden-state connector writes, one per request (eagle3/target_model/capture_vllm.py
runs the engine): waiting until one is whole, reading it back as a checked record, removing it and
its lock."""

from __future__ import annotations

import fcntl
import os
import time

import torch

from eagle3.target_model.adapter import CapturedSample, CaptureError, CaptureSpec, to_captured_sample
from eagle3.target_model.records import CONNECTOR_HIDDEN_KEY, CONNECTOR_TOKENS_KEY

FILE_WAIT_S = 60.0  # the writer is the rank whose output the engine returns, so this is a guard


def wait_whole(path: str, sample_id: str, timeout_s: float = FILE_WAIT_S) -> None:
    """Until the native connector's file is whole: it holds ``<path>.lock`` exclusively from
    the request's first step until the write ends (vLLM's own load_hidden_states waits the
    same way, with no deadline)."""
    deadline = time.monotonic() + timeout_s
    lock = f"{path}.lock"
    while not os.path.exists(path) and not os.path.exists(lock):
        if time.monotonic() > deadline:
            absent = f"absent (and no {os.path.basename(lock)}) after {timeout_s:.0f} s"
            raise _not_whole(path, "written by vLLM's ExampleHiddenStatesConnector", absent, sample_id)
        time.sleep(0.005)
    if not os.path.exists(lock):
        return
    with open(lock) as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    locked = f"still locked after {timeout_s:.0f} s"
                    raise _not_whole(
                        path, "whole (its lock released by the connector's writer)", locked, sample_id
                    ) from None
                time.sleep(0.002)


def _not_whole(path: str, expected: str, got: str, sample_id: str) -> CaptureError:
    return CaptureError(f"hidden-state file {path}", expected, got, sample_id=sample_id)


def read_native_file(
    path: str, *, spec: CaptureSpec, input_ids: torch.Tensor, loss_mask: torch.Tensor, sample_id: str
) -> CapturedSample:
    """One file of vLLM's ExampleHiddenStatesConnector -> a checked record. The adapter
    refuses a file with another layer count, hidden size or row count, or the token ids of
    another request; nothing is reshaped to fit."""
    from safetensors.torch import load_file

    wait_whole(path, sample_id)
    data = load_file(path)
    missing = [k for k in (CONNECTOR_HIDDEN_KEY, CONNECTOR_TOKENS_KEY) if k not in data]
    if missing:
        raise CaptureError(
            f"{path} tensors",
            [CONNECTOR_HIDDEN_KEY, CONNECTOR_TOKENS_KEY],
            f"{sorted(data)} (missing {missing})",
            sample_id=sample_id,
        )
    return to_captured_sample(
        data[CONNECTOR_HIDDEN_KEY],
        spec=spec,
        sent_token_ids=input_ids,
        loss_mask=loss_mask,
        returned_token_ids=data[CONNECTOR_TOKENS_KEY],
        sample_id=sample_id,
    )


def remove_file(path: str) -> None:
    """The file and its ``.lock``, whichever exist."""
    for p in (path, f"{path}.lock"):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass
