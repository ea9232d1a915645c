"""Export writes only its own files (issue 48): into a new or empty directory, or over a previous
export recognised by its files; a directory holding anything else is refused, untouched."""

from __future__ import annotations

import json

import pytest
from helpers import tiny_head_with_meta
from safetensors.torch import load_file

from eagle3.draft.serving_format import ExportDirError, save_head


def test_an_export_into_a_directory_of_other_files_is_refused_and_leaves_it_whole(tmp_path):
    head, meta = tiny_head_with_meta()
    out = tmp_path / "mine"
    other = save_head(head, meta, tmp_path / "other_head")  # another head, kept in a user's folder
    out.mkdir()
    (out / "README.txt").write_text("my notes")
    (out / "other_head").mkdir()
    (out / "other_head" / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(ExportDirError) as e:
        save_head(head, meta, out)
    msg = str(e.value)
    assert f"out={out}" in msg and "README.txt" in msg and "other_head" in msg and "out=<a new directory>" in msg
    assert sorted(p.name for p in out.iterdir()) == ["README.txt", "other_head"]
    assert (out / "README.txt").read_text() == "my notes"


def test_a_previous_export_with_a_foreign_file_is_refused(tmp_path):
    head, meta = tiny_head_with_meta()
    out = save_head(head, meta, tmp_path / "export")
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ExportDirError, match=r"foreign files \['notes.txt'\]"):
        save_head(head, meta, out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_a_directory_with_a_non_eagle3_config_is_refused(tmp_path):
    head, meta = tiny_head_with_meta()
    out = tmp_path / "hf_model"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (out / "model.safetensors").write_bytes(b"not ours")
    with pytest.raises(ExportDirError, match="no export's config.json"):
        save_head(head, meta, out)
    assert (out / "model.safetensors").read_bytes() == b"not ours"


def test_new_empty_and_previous_export_directories_are_written(tmp_path):
    head, meta = tiny_head_with_meta(0)
    save_head(head, meta, tmp_path / "new")  # new
    (tmp_path / "empty").mkdir()
    save_head(head, meta, tmp_path / "empty")  # empty
    out = tmp_path / "new"
    for name in ("acceptance.json", "serving.json", "acceptance.png", "README.md"):
        (out / name).write_text("{}")
    (out / "acceptance-logs").mkdir()
    head2, _ = tiny_head_with_meta(1)
    save_head(head2, meta, out)  # a previous export with what evaluate.py added: swapped whole
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "eagle3_meta.json", "model.safetensors"]
    assert (
        load_file(str(out / "model.safetensors")).keys()
        == load_file(str(tmp_path / "empty" / "model.safetensors")).keys()
    )
