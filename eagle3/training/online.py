"""Online hidden states: the frozen target runs inside training and turns each batch of token
samples into the batch the offline path would have read from disk for the same samples.

Each training process holds its own full copy of the target on its device (DDP: one per
rank), in inference mode. Its hidden states come in the capture dtype, as offline; the forward
computes in it too, except on a CPU without native bf16 matmuls, where the capture backend runs
it in fp32 and rounds the states to the capture dtype (eagle3/target_model/compute_dtype.py). Its
records pass through the same typed adapter as extraction (eagle3/target_model/adapter.py): a wrong
layer count, hidden size or token count fails the step with the sample named, as it fails an
extraction. A target too large for one device is refused (train.hidden_states=online with
topology.strategy=fsdp): train it from an extracted dataset (vLLM with tensor parallelism), see
docs/scaling.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from eagle3.store.packing import collate_rows
from eagle3.target_model.capture_hf import HFCaptureBackend
from eagle3.target_model.records import CaptureError

# samples per target forward: the token cap (capture.max_tokens_per_batch) is the real limit
_MAX_SAMPLES_PER_FORWARD = 4096


class OnlineHiddenStates:
    """Callable on a list of token samples (dicts with sample_id, input_ids [T], loss_mask [T])
    -> the collated batch of ``eagle3.store.packing.collate_rows``, hidden states on the target's device."""

    def __init__(
        self,
        target_dir: str,
        layer_ids: Sequence[int],
        hidden_size: int,
        dtype: torch.dtype,
        *,
        max_tokens_per_batch: int,
        row_tokens: int | None,
        fixed_shape: bool,
        forward_tokens: int = 16384,
        trust_remote_code: bool = False,
        model: torch.nn.Module | None = None,
    ):
        self.target_dir, self.layer_ids = str(target_dir), [int(i) for i in layer_ids]
        self.hidden_size, self.dtype = int(hidden_size), dtype
        self.max_tokens, self.row_tokens, self.fixed_shape = int(max_tokens_per_batch), row_tokens, bool(fixed_shape)
        self.forward_tokens = int(forward_tokens)  # padded tokens per target forward
        self.trust_remote_code = bool(trust_remote_code)
        self._model = model  # an already-built base model (benchmarks); None: load target_dir
        self.backend: HFCaptureBackend | None = None
        self.tokens = 0  # tokens run through the target so far, in this process

    def setup(self, device: torch.device | str) -> None:
        """Load the target onto ``device`` (once; the device of this training process)."""
        if self.backend is not None:
            return
        self.backend = HFCaptureBackend(
            self.target_dir,
            self.layer_ids,
            dtype=self.dtype,
            device=str(device),
            max_tokens_per_batch=max(self.forward_tokens, self.max_tokens),
            batch_size=_MAX_SAMPLES_PER_FORWARD,
            trust_remote_code=self.trust_remote_code,
            keep_on_device=True,
            model=self._model,
        )
        for p in self.backend.model.parameters():
            p.requires_grad_(False)
        if self.backend.hidden_size != self.hidden_size:
            raise CaptureError(
                f"{self.target_dir} hidden size", f"{self.hidden_size} (the dataset's)", self.backend.hidden_size
            )

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if self.backend is None:
            raise RuntimeError("OnlineHiddenStates: call setup(device) before the first batch")
        feed = ((item["sample_id"], item["input_ids"], item["loss_mask"]) for item in items)
        # in input order: the same order the offline collate sees for the same batch
        records = list(self.backend.capture(feed))
        rows = [{"input_ids": r.token_ids, "loss_mask": r.loss_mask, "hidden": r.states()} for r in records]
        self.tokens += sum(r.num_tokens for r in records)
        # collate_rows concatenates outside inference mode: the batch is an ordinary tensor the
        # head's autograd may save
        return collate_rows(rows, self.max_tokens, self.row_tokens, self.fixed_shape)

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        self._model = None  # a model handed in is released too
