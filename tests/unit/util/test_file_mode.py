"""Files written through safetensors get the mode the umask gives, as every other file: safetensors
writes through a temp file of its own and leaves it 0600 whatever the umask, so a dataset's
vocabulary and token counts, and a target built into the shared cache, could not be read by the
group that shares them."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from helpers import tiny_head_with_meta
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
    from eagle3.draft.serving_format import save_head

    head, meta = tiny_head_with_meta()
    out = save_head(head, meta, tmp_path / "export")
    assert _mode(out / "model.safetensors") == 0o666 & ~umask
