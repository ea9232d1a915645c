"""Files written through safetensors get the mode the umask gives, as every other file: safetensors
writes through a temp file of its own and leaves it 0600 whatever the umask, so a dataset's
vocabulary and token counts, and a target built into the shared cache, could not be read by the
group that shares them."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from eagle3.store.layout import save_tensors_atomic
from eagle3.target_model.resolve import _build_once
from eagle3.util.file_mode import apply_umask


@pytest.fixture(params=[0o022, 0o077], ids=["umask 022", "umask 077"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_datasets_tensor_files_follow_the_umask(tmp_path, umask):
    save_tensors_atomic(tmp_path / "token_freq.safetensors", {"token_freq": torch.zeros(4)})
    assert _mode(tmp_path / "token_freq.safetensors") == 0o666 & ~umask


def test_a_target_built_into_the_cache_follows_the_umask(tmp_path, umask):
    def build(tmp):
        save_file({"w": torch.zeros(2)}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text("{}")

    final = _build_once(tmp_path / "targets" / "tiny", build)
    assert _mode(final / "model.safetensors") == 0o666 & ~umask
    assert _mode(final / "config.json") == 0o666 & ~umask


def test_apply_umask_sets_a_files_mode_and_leaves_the_umask(tmp_path, umask):
    path = tmp_path / "x.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    apply_umask(path)
    assert _mode(path) == 0o666 & ~umask
    assert os.umask(umask) == umask  # unchanged by reading it


def test_an_exports_weights_follow_the_umask(tmp_path, umask):
    from eagle3.draft.config import DraftConfig
    from eagle3.draft.head import Eagle3DraftHead
    from eagle3.draft.serving_format import DraftMeta, save_head

    cfg = DraftConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        target_vocab_size=97,
        draft_vocab_size=40,
        rope_theta=10000.0,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
    )
    head = Eagle3DraftHead(cfg)
    t2d = torch.zeros(97, dtype=torch.bool)
    t2d[:40] = True
    head.load_target_weights(
        torch.randn(97, 32), torch.ones(32), torch.randn(97, 32), torch.zeros(40, dtype=torch.int64), t2d, True
    )
    out = save_head(head, DraftMeta(cfg, [1, 2, 3], "tiny-target", ["LlamaForCausalLM"], 3), tmp_path / "export")
    assert _mode(out / "model.safetensors") == 0o666 & ~umask
