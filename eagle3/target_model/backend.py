"""The capture backend protocol extraction calls, and the backend named by config
(``capture.backend=hf|vllm``); both yield checked CapturedSamples."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

from eagle3.config import choices, dataset, target
from eagle3.target_model.records import CapturedSample, DeviceEncoding

Feed = Iterable[tuple[str, torch.Tensor, torch.Tensor]]  # (sample_id, input_ids [T], loss_mask [T])


class CaptureBackend(Protocol):
    """What ``capture_hf.HFCaptureBackend`` and ``capture_vllm.VLLMCaptureBackend`` both offer."""

    def capture_with_ids(self, samples: Feed) -> Iterator[tuple[str, CapturedSample]]:
        """(sample_id, record) pairs in the backend's own order: pair them by id."""
        ...

    def capture(self, samples: Feed) -> Iterator[CapturedSample]:
        """One record per input, in input order."""
        ...

    def close(self) -> None:
        """Free the model (and the engine, spill files); the backend is unusable after."""
        ...


def make_backend(
    capture: dataset.CaptureConfig,
    topology: target.TopologyConfig,
    target_dir: str,
    layer_ids: list[int],
    dtype: torch.dtype,
    max_length: int,
    *,
    trust_remote_code: bool = False,
    device_encoding: DeviceEncoding | None = None,
    quantization: choices.Quantization | None = None,
) -> CaptureBackend:
    """The backend ``capture.backend`` names, laid out on ``topology`` (the HF forward on its
    GPU; vLLM with its extraction TP/DP), for prompts of at most ``max_length`` tokens.
    ``device_encoding``: the HF backend on a GPU encodes the states there (capture.storage); vLLM's
    connector writes them from its own process, so its records are encoded by the dataset writer.
    ``quantization``: model.quantization, which only vLLM runs (the HF backend refuses it)."""
    backend = capture.backend
    if backend == choices.CaptureBackend.hf:
        from eagle3.target_model.quantization import hf_route_refusal, vllm_name

        if quantization is not None and vllm_name(quantization) is not None:
            raise ValueError(hf_route_refusal("capture=hf", quantization, "capture=vllm"))
        from eagle3.target_model.capture_hf import HFCaptureBackend

        device = "cuda" if topology.accelerator in ("gpu", "cuda") and torch.cuda.is_available() else "cpu"
        return HFCaptureBackend(
            target_dir,
            layer_ids,
            dtype=dtype,
            device=device,
            max_tokens_per_batch=capture.max_tokens_per_batch,
            batch_size=capture.batch_size,
            trust_remote_code=trust_remote_code,
            device_encoding=device_encoding,
        )
    if backend == choices.CaptureBackend.vllm:
        from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend

        engine = CaptureEngine(
            tensor_parallel_size=topology.extract_tp,
            data_parallel_size=topology.extract_dp,
            gpu_memory_utilization=capture.gpu_memory_utilization,
            cpu_kvcache_space_gb=capture.cpu_kvcache_space_gb,
            max_num_seqs=capture.max_num_seqs,
            max_model_len=max_length + 8,
            enable_prefix_caching=capture.enable_prefix_caching,
            trust_remote_code=trust_remote_code,
            quantization=quantization,
        )
        return VLLMCaptureBackend(target_dir, layer_ids, dtype=dtype, engine=engine, route=capture.vllm_route.value)
    raise ValueError(f"capture.backend: expected hf|vllm, got {backend.value!r}")
