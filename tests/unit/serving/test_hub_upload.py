"""What a push to the Hub uploads and deletes (eagle3/serving/hub_upload.py), decided without the
network: no path of this machine in any uploaded file, and the previous head's files that the new
export lacks deleted in the same commit. A tiny random head exported by the export's owner."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

from helpers import tiny_head_with_meta

from eagle3.draft.export_files import ACCEPTANCE, ACCEPTANCE_PLOT, ADVICE, CARD, CONFIG, ENGINE_LOGS, META, WEIGHTS
from eagle3.serving.export_dir import publish_export, write_export
from eagle3.serving.hub_upload import operations, uploads
from eagle3.serving.training_record import set_training_record

REPO = "someone/tiny-eagle3"


def _export(tmp_path: Path, hub_id: str | None = None) -> Path:
    """An export whose files name local paths the way a real run's do: the target's cache path
    (config.json's verifier), the data file and target path (the training record), the export,
    dataset and engine logs (acceptance.json), and the card that shows them."""
    head, meta = tiny_head_with_meta()
    target = tmp_path / "cache" / "models" / "tiny-llama"
    meta = dataclasses.replace(meta, target_name_or_path=str(target))
    out = write_export(head, meta, tmp_path / "runs" / "one" / "export").directory
    chats = tmp_path / "my data" / "chats.jsonl"
    set_training_record(
        out,
        {
            "target": {"name": "tiny-llama", "hub_id": hub_id, "path": str(target), "revision": None},
            "data": {"source": "jsonl", "path": str(chats), "file_name": chats.name, "samples": 40},
            "run": {"global_step": 6, "checkpoint": "last.ckpt", "num_draft_tokens": 3},
        },
    )
    logs = out / ENGINE_LOGS / "engine-with-head.log"
    logs.parent.mkdir()
    logs.write_text(f"engine started for {out}")
    acceptance = {
        "export_dir": str(out),
        "verifier": str(target),
        "dataset_dir": str(tmp_path / "data" / "0123abcd"),
        "num_draft_tokens": 3,
        "max_new_tokens": 32,
        "mean_acceptance_length": 1.8,
        "per_position_acceptance_rate": [0.5, 0.2, 0.1],
        "engine": {"vllm_version": "0.32.0", "platform": "cpu", "log": str(logs)},
        "prompt_notes": [f"val prompts from {tmp_path / 'data' / '0123abcd'}/manifest.json"],
    }
    (out / ACCEPTANCE).write_text(json.dumps(acceptance, indent=2))
    (out / ACCEPTANCE_PLOT).write_bytes(b"\x89PNG")
    publish_export(out)  # the advice (serving.json) and the card, as train.py and export.py write them
    return out


def _text(data: bytes | Path) -> str:
    return (data if isinstance(data, bytes) else data.read_bytes()).decode(errors="replace")


# ---- S9: no local absolute path in any uploaded file


def test_no_uploaded_file_names_a_path_of_this_machine(tmp_path):
    out = _export(tmp_path)
    local_config = (out / CONFIG).read_text()
    files = uploads(out, REPO)
    assert {CARD, CONFIG, WEIGHTS, META, ACCEPTANCE, ACCEPTANCE_PLOT, ADVICE} <= set(files)
    assert not any(name.startswith(ENGINE_LOGS) for name in files)
    for name, data in files.items():
        text = _text(data)
        assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text, (name, text[:2000])
    # what stays: relative names where a path was
    acceptance = json.loads(files[ACCEPTANCE])
    assert acceptance["export_dir"] == "." and acceptance["dataset_dir"] == "0123abcd"
    assert acceptance["engine"]["log"] == f"{ENGINE_LOGS}/engine-with-head.log"
    assert json.loads(files[META])["training"]["data"]["path"] == "chats.jsonl"  # a path with a space, whole
    # config.json: the target's name on the Hub (no hub id known), the local path kept locally
    config = json.loads(files[CONFIG])
    assert config["speculators_config"]["verifier"] == {
        "name_or_path": "tiny-llama",
        "architectures": ["LlamaForCausalLM"],
    }
    assert (out / CONFIG).read_text() == local_config and str(tmp_path) in local_config
    # the card: a placeholder and the architecture for the target, the repo for the head
    card = _text(files[CARD])
    assert "# EAGLE-3 draft head for <path to the target> (LlamaForCausalLM)" in card
    assert "jsonl (file_name: `chats.jsonl`, path: `chats.jsonl`)" in card
    command = card.split("```bash\n", 1)[1].split("\n```", 1)[0]
    args = shlex.split(command)
    assert args[:3] == ["vllm", "serve", "<path to the target>"] and json.loads(args[-1])["model"] == REPO


def test_a_target_with_a_hub_id_is_named_by_it_on_the_hub(tmp_path):
    out = _export(tmp_path, hub_id="HuggingFaceTB/tiny-llama")
    files = uploads(out, REPO)
    assert json.loads(files[CONFIG])["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/tiny-llama"
    card = _text(files[CARD])
    assert "# EAGLE-3 draft head for HuggingFaceTB/tiny-llama" in card
    assert "vllm serve HuggingFaceTB/tiny-llama --speculative-config" in card
    assert str(tmp_path) not in card


# ---- S7: a push over an existing repo deletes the previous head's files the new export lacks


def test_the_previous_heads_measurements_are_deleted_and_other_files_kept(tmp_path):
    out = _export(tmp_path)
    for name in (ACCEPTANCE, ACCEPTANCE_PLOT, ADVICE):  # a new head, not measured yet
        (out / name).unlink()
    files = uploads(out, REPO)
    remote = [CARD, CONFIG, WEIGHTS, META, ACCEPTANCE, ACCEPTANCE_PLOT, ADVICE, ".gitattributes", "notes.md"]
    ops = operations(files, remote)
    deleted = sorted(op.path_in_repo for op in ops if type(op).__name__ == "CommitOperationDelete")
    added = sorted(op.path_in_repo for op in ops if type(op).__name__ == "CommitOperationAdd")
    assert deleted == sorted([ACCEPTANCE, ACCEPTANCE_PLOT, ADVICE])
    assert added == sorted(files) == sorted([CARD, CONFIG, WEIGHTS, META])
