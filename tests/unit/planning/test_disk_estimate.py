"""The disk a run will take, said before it books a GPU: the training checkpoints' disk of a
head and of a user's model, SmolLM2's estimate, a weight format refused as a hidden dtype. The
Kimi-K2.5 preset through `--cfg job --resolve`: integration/test_disk_estimate_kimi.py."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from eagle3.config.errors import ConfigError
from eagle3.planning.disk_estimate import disk_bytes
from eagle3.stages.validate import validate_run_config
from eagle3.store.disk import disk_needed_bytes, format_bytes
from eagle3.store.storage_format import StorageFormat

KIMI = ["model=kimi_k2_5", "topology=gpu8_tp8", "capture=vllm"]


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
