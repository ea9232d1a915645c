"""The Kimi-K2.5 preset's estimates as `--cfg job --resolve` of both entrypoints shows them (a
subprocess each): the 8-GPU layout, the disk per million tokens extract.py checks, the checkpoint
disk training writes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from omegaconf import OmegaConf

from eagle3.store.disk import disk_needed_bytes, format_bytes

KIMI = ["model=kimi_k2_5", "topology=gpu8_tp8", "capture=vllm"]


KIMI_BYTES_PER_TOKEN = 4 * 7168 * 2 + 8 + 1  # 4 layers x hidden x bf16 + token id + mask


@pytest.fixture(scope="module", params=["extract.py", "train.py"])
def kimi_resolved(request):
    out = subprocess.run(
        [sys.executable, request.param, *KIMI, "--cfg", "job", "--resolve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return OmegaConf.create(out.stdout)


def test_kimi_estimate_shows_the_8_gpu_layout(kimi_resolved):
    cfg = kimi_resolved
    assert (cfg.topology.devices, cfg.topology.extract_tp, cfg.topology.extract_dp) == (8, 8, 1)
    assert cfg.topology.strategy == "ddp" and cfg.topology.precision == "bf16-mixed"
    assert list(cfg.layers.aux_layer_ids) == [2, 30, 58]
    assert list(cfg.layers.layer_ids) == [2, 30, 58, 61]
    assert cfg.model.hidden_size == 7168 and cfg.model.num_layers == 61
    assert cfg.capture.backend == "vllm" and cfg.capture.enable_prefix_caching is False
    # the INT4 weight format (the checkpoint's compressed-tensors) stays in model.quantization; hidden states are bf16
    assert cfg.model.quantization == cfg.engine.quantization == "compressed_tensors"  # --cfg job prints the name
    assert cfg.capture.dtype == "bfloat16"
    assert cfg.capture.hidden_layout == "bfloat16 [T, 4, 7168]"


def test_kimi_disk_per_million_tokens_is_what_extract_checks(kimi_resolved):
    need = disk_needed_bytes(1_000_000, 4, 7168, torch.bfloat16, 0, 65536)
    assert need // 1_000_000 == KIMI_BYTES_PER_TOKEN  # the shard overhead is below a byte per token
    assert kimi_resolved.capture.disk_per_1m_tokens == format_bytes(need) == "53.4 GiB"


def test_kimi_checkpoint_disk_is_the_size_its_training_wrote(kimi_resolved):
    """The head at Kimi-K2.5's width (hidden 7,168, one decoder layer of its dense sizes, a
    32,000-token draft vocabulary) built on the meta device: 1.14B trainable parameters. Its
    rehearsal on the H200 (docs/records/2026-12-04-rehearsal-kimi-k2-5.md) wrote checkpoints of 13,675,525,472 bytes."""
    estimate = str(kimi_resolved.callbacks.model_checkpoint.disk)
    assert estimate.startswith("12.7 GiB a checkpoint (1.14B trainable parameters), up to 3 at once: 38.2 GiB")
    assert format_bytes(13_675_525_472) == "12.7 GiB"
