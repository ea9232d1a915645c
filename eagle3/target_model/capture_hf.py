"""Capture with transformers: forward hooks on the base model, batched, padding stripped.

Layer ids follow vLLM (docs/architecture.md, "Layer ids"): id k < N is the hidden state
*entering* decoder layer k (a forward pre-hook on layer k; equals HF
``output_hidden_states[k]``); id N is the *output* of the last decoder layer, before the
final norm (a forward hook; HF's last ``output_hidden_states`` entry is after the norm and
would disagree with vLLM). The base model is run, not the CausalLM head: no lm_head
matmul over the vocabulary, which for large vocabularies costs more than a decoder layer.

The forward runs in ``compute_dtype(dtype, device)`` (eagle3/target_model/compute_dtype.py): the
stored dtype, or fp32 on a CPU that would emulate it; the hidden states are cast to the stored
dtype before the adapter sees them, so records (and datasets) are the same either way.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from eagle3.target_model.adapter import (
    CapturedSample,
    CaptureError,
    CaptureSpec,
    to_captured_sample,
    to_encoded_sample,
)
from eagle3.target_model.compute_dtype import compute_dtype, compute_note
from eagle3.target_model.host_copy import BatchToHost
from eagle3.target_model.records import DeviceEncoding

log = logging.getLogger(__name__)

SORT_WINDOW_BATCHES = 16  # samples are sorted by length within this many batches' worth


@dataclass
class _Pending:
    index: int  # position in the input (capture()'s output order)
    sample_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor


@dataclass
class _InFlight:
    """A batch whose forward is queued: its hidden states on the device (CPU) or on their way
    to pinned host memory (CUDA)."""

    batch: list[_Pending]
    input_ids: torch.Tensor  # [B, T] as sent, on the host
    lengths: list[int]
    stacked: torch.Tensor | None  # [B, T, L, H], CPU path
    to_host: BatchToHost | None  # CUDA path


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layer list of a transformers base model (text or multimodal)."""
    for path in ("layers", "language_model.layers", "model.layers", "decoder.layers"):
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.nn.ModuleList) and len(obj):
            return obj
    raise CaptureError(
        f"{type(model).__name__} decoder layers",
        "a ModuleList at .layers, .language_model.layers, .model.layers or .decoder.layers",
        "none found",
    )


def _load_base_model(target_dir: str, dtype: torch.dtype, trust_remote_code: bool = False) -> torch.nn.Module:
    """The base model without its LM head. transformers reports the head's weights as
    "unexpected" in a noisy warning; we silence that and instead refuse what matters:
    weights the base model needed but did not find (they would be random)."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModel.from_pretrained(
            target_dir, dtype=dtype, output_loading_info=True, trust_remote_code=trust_remote_code
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(info.get("mismatched_keys") or [])
    if missing or mismatched:
        raise CaptureError(
            f"{target_dir} weights",
            "every base-model weight present with its shape",
            f"missing {missing[:5]}, mismatched {mismatched[:5]}",
        )
    return model


class HFCaptureBackend:
    """Capture hidden states for ``layer_ids`` (vLLM numbering) with transformers."""

    def __init__(
        self,
        target_dir: str,
        layer_ids: Sequence[int],
        dtype: torch.dtype = torch.bfloat16,
        device: str = "cpu",
        max_tokens_per_batch: int = 16384,
        batch_size: int = 8,
        trust_remote_code: bool = False,
        keep_on_device: bool = False,
        model: torch.nn.Module | None = None,
        device_encoding: DeviceEncoding | None = None,
    ):
        """``dtype``: the stored dtype of the records. ``keep_on_device``: records keep their
        hidden states on ``device`` (online training feeds them straight to the head) instead of
        copying them to host memory. ``model``: an already-built base model to run instead of
        loading ``target_dir`` (benchmarks), in the dtype it was built in. ``device_encoding``: on a
        CUDA device, the states are encoded in that storage format there and only its tensors are
        copied to the host (records carry ``encoded``); a CPU capture leaves the encode to the
        dataset writer's threads."""
        if batch_size < 1 or max_tokens_per_batch < 1:
            raise CaptureError(
                "capture batch limits",
                "batch_size >= 1 and max_tokens_per_batch >= 1",
                f"batch_size={batch_size}, max_tokens_per_batch={max_tokens_per_batch}",
            )
        self.target_dir = str(target_dir)
        self.dtype = dtype
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.max_tokens_per_batch = int(max_tokens_per_batch)
        self.keep_on_device = bool(keep_on_device)
        self.device_encoding = device_encoding
        if model is None:
            self.compute_dtype = compute_dtype(dtype, self.device)
            note = compute_note(dtype, self.compute_dtype)
            if note:
                log.info("capture (hf): %s; hidden states stored in %s", note, dtype)
            model = _load_base_model(self.target_dir, self.compute_dtype, trust_remote_code)
        else:
            self.compute_dtype = next(model.parameters()).dtype
        # Any: a transformers model (its .config is read, which nn.Module does not declare); None once closed
        self.model = cast(Any, model.to(self.device).eval())
        layers = _decoder_layers(self.model)
        n = len(layers)
        ids = [int(i) for i in layer_ids]
        if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] > n:
            raise CaptureError(
                "layer_ids", f"unique ascending ids in 0..{n} (N={n} decoder layers in {self.target_dir})", ids
            )
        self.layer_ids = tuple(ids)
        self.num_layers = n
        self.hidden_size = int(self.model.config.get_text_config().hidden_size)
        self._captured: dict[int, torch.Tensor] = {}
        # CUDA: finish batch i after queueing forward i+1, so its host copy runs beside that
        # forward. Off until measured faster: on an H200 it bought nothing over the plain path
        # (bench/extract_throughput.py hf_overlap; docs/records/2026-12-01-extraction-throughput.md)
        self.overlap_host_copy = False
        self._hooks = []
        for lid in ids:
            if lid < n:  # the residual stream entering layer lid
                self._hooks.append(layers[lid].register_forward_pre_hook(self._pre_hook(lid), with_kwargs=True))
            else:  # the last layer's output, before the final norm
                self._hooks.append(layers[n - 1].register_forward_hook(self._post_hook(lid)))

    def _pre_hook(self, lid: int):
        def hook(module, args, kwargs):
            h = args[0] if args else kwargs.get("hidden_states")
            self._store(lid, h)

        return hook

    def _post_hook(self, lid: int):
        def hook(module, args, output):
            self._store(lid, output[0] if isinstance(output, (tuple, list)) else output)

        return hook

    def _store(self, lid: int, h) -> None:
        if not isinstance(h, torch.Tensor) or h.dim() != 3:
            raise CaptureError(
                f"hook for layer id {lid}", "a hidden-state tensor [B, T, H]", getattr(h, "shape", type(h).__name__)
            )
        self._captured[lid] = h.detach()

    # ------------------------------------------------------------------ batching

    def _batches(self, window: list[_Pending]) -> Iterator[list[_Pending]]:
        """Longest first, so each batch pads little; limits on count and padded tokens."""
        batch: list[_Pending] = []
        for p in sorted(window, key=lambda p: -p.input_ids.shape[0]):
            longest = batch[0].input_ids.shape[0] if batch else p.input_ids.shape[0]
            if batch and (len(batch) >= self.batch_size or longest * (len(batch) + 1) > self.max_tokens_per_batch):
                yield batch
                batch = []
            batch.append(p)
        if batch:
            yield batch

    @torch.inference_mode()
    def _launch(self, batch: list[_Pending]) -> _InFlight:
        """The forward for ``batch``; on CUDA also the on-device checks and the host copy on a
        side stream, all queued without waiting (``_finish`` waits)."""
        lengths = [p.input_ids.shape[0] for p in batch]
        T = max(lengths)
        ids = torch.zeros(len(batch), T, dtype=torch.int64)
        attn = torch.zeros(len(batch), T, dtype=torch.int64)
        for row, p in enumerate(batch):  # right padding: real tokens keep positions 0..t-1
            ids[row, : lengths[row]] = p.input_ids
            attn[row, : lengths[row]] = 1
        self._captured = {}
        if self.device.type == "cuda":  # a pageable copy would block this thread until the GPU is idle
            ids_dev, attn_dev = (t.pin_memory().to(self.device, non_blocking=True) for t in (ids, attn))
        else:
            ids_dev, attn_dev = ids, attn
        self.model(input_ids=ids_dev, attention_mask=attn_dev, use_cache=False)
        missing = [lid for lid in self.layer_ids if lid not in self._captured]
        if missing:
            raise CaptureError("captured layer ids", list(self.layer_ids), f"no output for {missing}")
        # [B, T, L, H] on the model's device: each row's prefix is then the stored [t, L, H] layout
        stacked = torch.stack([self._captured[lid] for lid in self.layer_ids], dim=2)
        self._captured = {}
        if stacked.device.type == "cuda" and not self.keep_on_device:
            # cast, checked and (device_encoding) encoded on the device
            to_host = BatchToHost(stacked, attn_dev.bool(), lengths, self.dtype, self.device_encoding)
            return _InFlight(batch, ids, lengths, stacked=None, to_host=to_host)
        # an fp32 forward (a CPU without native bf16) is rounded to the stored dtype here, once
        return _InFlight(batch, ids, lengths, stacked=stacked.to(self.dtype), to_host=None)

    @torch.inference_mode()
    def _finish(self, flight: _InFlight) -> list[CapturedSample]:
        """Checked records of a launched batch, padding stripped (never stored)."""
        rows: Sequence[tuple[dict[str, torch.Tensor], bool | None]]
        if flight.to_host is not None:
            rows = flight.to_host.rows()
        else:
            assert flight.stacked is not None  # the CPU path's batch
            rows = [({"hidden": flight.stacked[row, :t]}, None) for row, t in enumerate(flight.lengths)]
        out = []
        for row, (p, (tensors, finite)) in enumerate(zip(flight.batch, rows)):
            t = flight.lengths[row]
            spec = CaptureSpec(self.layer_ids, self.hidden_size, self.dtype, p.input_ids.shape[0])
            if "hidden" not in tensors:  # encoded on the device (device_encoding)
                assert self.device_encoding is not None and finite is not None  # BatchToHost's rows
                record = to_encoded_sample(
                    tensors,
                    storage=self.device_encoding.storage,
                    spec=spec,
                    sent_token_ids=p.input_ids,
                    loss_mask=p.loss_mask,
                    finite_on_device=finite,
                    returned_token_ids=flight.input_ids[row, :t],
                    sample_id=p.sample_id,
                )
            else:
                record = to_captured_sample(
                    tensors["hidden"],
                    spec=spec,
                    sent_token_ids=p.input_ids,
                    loss_mask=p.loss_mask,
                    returned_token_ids=flight.input_ids[row, :t],
                    sample_id=p.sample_id,
                    finite_on_device=finite,
                    keep_device=self.keep_on_device,
                )
            out.append(record)
        return out

    def _pipeline(self, batches: Iterable[list[_Pending]]) -> Iterator[tuple[_Pending, CapturedSample]]:
        """On CUDA, batch i's records are finished after batch i+1's forward is queued, so its
        host copy overlaps that forward; elsewhere each batch is finished at once."""
        in_flight: _InFlight | None = None
        for batch in batches:
            launched = self._launch(batch)
            if in_flight is not None:
                yield from zip(in_flight.batch, self._finish(in_flight))
            in_flight = launched
            if launched.to_host is None or not self.overlap_host_copy:
                yield from zip(launched.batch, self._finish(launched))
                in_flight = None
        if in_flight is not None:
            yield from zip(in_flight.batch, self._finish(in_flight))

    def _stream(
        self, samples: Iterable[tuple[str, torch.Tensor, torch.Tensor]]
    ) -> Iterator[tuple[_Pending, CapturedSample]]:
        """Records batch by batch, as soon as each batch is captured (batching order)."""
        return self._pipeline(self._windowed_batches(samples))

    def _windowed_batches(self, samples: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> Iterator[list[_Pending]]:
        window: list[_Pending] = []
        size = self.batch_size * SORT_WINDOW_BATCHES
        for index, (sample_id, input_ids, loss_mask) in enumerate(samples):
            input_ids = torch.as_tensor(input_ids)
            if input_ids.dim() != 1 or input_ids.shape[0] == 0:
                raise CaptureError(
                    "input_ids", "a non-empty 1-D tensor [T]", list(input_ids.shape), sample_id=str(sample_id)
                )
            window.append(_Pending(index, str(sample_id), input_ids.to(torch.int64), torch.as_tensor(loss_mask)))
            if len(window) >= size:
                yield from self._batches(window)
                window = []
        if window:
            yield from self._batches(window)

    def capture_with_ids(
        self, samples: Iterable[tuple[str, torch.Tensor, torch.Tensor]]
    ) -> Iterator[tuple[str, CapturedSample]]:
        """(sample_id, CapturedSample) pairs, handed over batch by batch as each forward
        finishes, so writing them overlaps the next forward. The order is the batching
        order (longest first within a sort window), not the input order: use the ids."""
        for p, s in self._stream(samples):
            yield p.sample_id, s

    def capture(self, samples: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> Iterator[CapturedSample]:
        """One checked ``CapturedSample`` per (sample_id, input_ids, loss_mask), in input
        order: a record waits until every earlier input's record is captured."""
        done: dict[int, CapturedSample] = {}
        next_index = 0
        for p, s in self._stream(samples):
            done[p.index] = s
            while next_index in done:
                yield done.pop(next_index)
                next_index += 1

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.model = None
        gc.collect()

    def __enter__(self) -> "HFCaptureBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
