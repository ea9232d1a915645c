"""`--cfg job --resolve` shows what a run will do before it books a GPU: the Kimi-K2.5
8-GPU layout (TP=8, aux ids [2, 30, 58] + 61, bf16 [T, 4, 7168], disk per 1M tokens, the
training checkpoints' disk)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, compose
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from eagle3.config.errors import ConfigError
from eagle3.planning.disk_estimate import disk_bytes
from eagle3.stages.validate import validate_run_config
from eagle3.store.disk import disk_needed_bytes, format_bytes
from eagle3.store.storage_format import StorageFormat

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


def test_checkpoint_disk_follows_the_head_and_the_checkpoints_kept():
    small = compose("train", ["experiment=tiny_test"]).callbacks.model_checkpoint.disk
    more = compose(
        "train", ["experiment=tiny_test", "head.num_draft_layers=2", "callbacks.model_checkpoint.save_top_k=3"]
    ).callbacks.model_checkpoint.disk
    each = [float(estimate.split(" ")[0]) for estimate in (small, more)]
    assert "up to 3 at once" in small and "up to 5 at once" in more and each[1] > each[0]


def test_checkpoint_disk_of_your_own_model_reads_its_config_json(tmp_path):
    """model=hf: the sizes the preset leaves open come from the model's config.json (as its facts
    do); the estimate equals the head train.py builds from that file."""
    from eagle3.draft.head import Eagle3DraftHead
    from eagle3.training.builder import draft_config
    from eagle3.training.checkpoint_io import head_checkpoint_bytes

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 16,
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = compose("train", ["model=hf", f"model.path={tmp_path}"])
    estimate = str(cfg.callbacks.model_checkpoint.disk)
    with torch.device("meta"):
        head = Eagle3DraftHead(draft_config(cfg.head, config, 3))
    assert estimate.startswith(f"{format_bytes(head_checkpoint_bytes(head))} a checkpoint"), estimate
    # no config.json to read the sizes from: estimated by train.py once it has the target
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(
        json.dumps({k: config[k] for k in ("architectures", "num_hidden_layers", "hidden_size", "vocab_size")})
    )
    partial = compose("train", ["model=hf", f"model.path={tmp_path}"]).callbacks.model_checkpoint.disk
    assert "known once the target's config.json is read" in partial


def test_smollm2_estimate_follows_the_model():
    cfg = compose("extract")
    assert cfg.capture.hidden_layout == "bfloat16 [T, 4, 576]"
    assert disk_bytes(1_000_000, [2, 15, 27, 30], 576, "bfloat16", 65536, StorageFormat()) == disk_needed_bytes(
        1_000_000, 4, 576, torch.bfloat16, 0, 65536
    )
    # more layers, wider dtype: the estimate follows the config, never a hard-coded figure
    wide = compose("extract", ["layers.aux_ids=[1,5,9,15,27]", "capture.dtype=float32"])
    assert wide.capture.hidden_layout == "float32 [T, 6, 576]"
    assert wide.capture.disk_per_1m_tokens == format_bytes(
        disk_needed_bytes(1_000_000, 6, 576, torch.float32, 0, 65536, StorageFormat.from_config(wide.capture))
    )


def test_a_weight_format_as_hidden_dtype_fails_naming_the_fields():
    """model.dtype is what the target computes in; setting it to the INT4 weight format
    must not silently produce int4 'hidden states'."""
    cfg = compose("extract", KIMI + ["model.dtype=int4"])
    with pytest.raises(InterpolationResolutionError, match="capture.dtype.*model.quantization"):
        OmegaConf.to_container(cfg.capture, resolve=True)
    with pytest.raises(ConfigError, match="capture.dtype"):
        validate_run_config(cfg)
