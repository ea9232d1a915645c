"""Files CUDA vLLM 0.26.0 wrote on an NVIDIA H200 through its stock ExampleHiddenStatesConnector
(SmolLM2, committed under tests/data/vllm_cuda_0.26/), read as the native route reads them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import ROOT
from safetensors.torch import load_file

from eagle3.target_model.adapter import CaptureSpec
from eagle3.target_model.connector_files import read_native_file

CUDA_FILES_DIR = ROOT / "tests" / "data" / "vllm_cuda_0.26"
CUDA_FILES = sorted(CUDA_FILES_DIR.glob("*.safetensors"))
CUDA_LAYER_IDS = (2, 15, 27, 30)  # vLLM numbering; 30 = N, before the final norm
CUDA_HIDDEN = 576  # SmolLM2-135M


def cuda_file_side(path: Path) -> dict:
    """The request beside a file (its .json): layer ids, loss mask, sample id."""
    return json.loads(path.with_suffix(".json").read_text())


def read_cuda_file(path: Path, input_ids: torch.Tensor | None = None):
    """The CapturedSample the native route reads from ``path`` (``input_ids``: the request's
    tokens, the file's own by default)."""
    data = load_file(str(path))
    ids = data["token_ids"] if input_ids is None else input_ids
    side = cuda_file_side(path)
    return read_native_file(
        str(path),
        spec=CaptureSpec(CUDA_LAYER_IDS, CUDA_HIDDEN, torch.bfloat16, int(ids.shape[0])),
        input_ids=ids,
        loss_mask=torch.tensor(side["loss_mask"], dtype=torch.bool),
        sample_id=side["sample_id"],
    )
