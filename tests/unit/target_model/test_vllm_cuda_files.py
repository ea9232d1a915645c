"""Files CUDA vLLM 0.26.0 wrote on an NVIDIA H200 through its stock ``ExampleHiddenStatesConnector``
(the ``native`` route), committed under tests/data/vllm_cuda_0.26/: the reader and the adapter
take what the GPU build really writes, on a machine with no GPU and no vLLM.

They were made by ``bench/vllm_capture_parity.py --keep-files DIR --keep-n 3 --keep-max-tokens 40``
(SmolLM2-135M-Instruct in bf16, capture ids [2, 15, 27, 30], ShareGPT chats and a shared-prefix
chat; lab/leased_gpu/gpu_vllm_run.sh's capture stage), each cut to 40 tokens with a sidecar holding the
request's sample id, loss mask and capture ids.
"""

from __future__ import annotations

import pytest
import torch
from helpers.cuda_files import CUDA_FILES, CUDA_HIDDEN, CUDA_LAYER_IDS, cuda_file_side, read_cuda_file
from safetensors.torch import load_file, save_file

from eagle3.target_model.adapter import CaptureError


def test_the_committed_files_are_the_connectors_format():
    assert len(CUDA_FILES) == 3
    for path in CUDA_FILES:
        data = load_file(str(path))
        assert set(data) == {"hidden_states", "token_ids"}, path.name
        assert (
            data["hidden_states"].shape == (40, len(CUDA_LAYER_IDS), CUDA_HIDDEN)
            and data["hidden_states"].dtype == torch.bfloat16
        )
        assert cuda_file_side(path)["layer_ids"] == list(CUDA_LAYER_IDS)
        rec = read_cuda_file(path)
        assert torch.equal(rec.token_ids, data["token_ids"]) and rec.hidden.shape == (
            40,
            len(CUDA_LAYER_IDS),
            CUDA_HIDDEN,
        )
        assert rec.loss_mask.tolist() == [bool(m) for m in cuda_file_side(path)["loss_mask"]]


def test_a_cuda_file_with_one_layer_where_four_were_asked_is_refused(tmp_path):
    """The seed's failure class on the GPU route's own output."""
    src = CUDA_FILES[0]
    data = load_file(str(src))
    bad = tmp_path / src.name
    save_file({"hidden_states": data["hidden_states"][:, :1].contiguous(), "token_ids": data["token_ids"]}, str(bad))
    bad.with_suffix(".json").write_text(src.with_suffix(".json").read_text())
    with pytest.raises(CaptureError, match=r"hidden: expected .*4.*576.*got tensor\[40, 1, 576\]"):
        read_cuda_file(bad)


def test_a_cuda_file_of_another_request_is_refused():
    a, b = CUDA_FILES[0], CUDA_FILES[1]
    with pytest.raises(CaptureError, match="returned_token_ids"):
        read_cuda_file(b, input_ids=load_file(str(a))["token_ids"])
