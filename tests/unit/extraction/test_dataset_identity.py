"""The dataset fingerprint holds content, not places: copies of the model and of the chat file
elsewhere give the same dataset, other content another; the regeneration engine is recorded in
the manifest, not fingerprinted; moved datasets are taken with dataset_dir= (train.py and
evaluate); datasets named by the first scheme are found or named. Tiny random Llama, a few
chats written here; the runs: integration/test_dataset_identity_runs.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import jsonl_extract_config, write_numbered_chats

from eagle3.extraction.identity import (
    DatasetNotFound,
    dataset_path,
    fingerprint_inputs,
    legacy_fingerprint_inputs,
    token_dataset_path,
    token_fingerprint_inputs,
)
from eagle3.extraction.locate import legacy_dataset_path, locate_dataset
from eagle3.stages.narrow import dataset_identity
from eagle3.store import Manifest, dataset_fingerprint
from eagle3.store.fingerprint import canonical
from eagle3.util.hashing import ContentShaCache, file_sha256, sampled_file_sha

TINY = ["experiment=tiny_test"]


def _changed(a: dict, b: dict) -> list[str]:
    return sorted(
        f"{k}.{kk}" for k in a if isinstance(a[k], dict) for kk in set(a[k]) | set(b[k]) if a[k].get(kk) != b[k].get(kk)
    ) + sorted(k for k in a if not isinstance(a[k], dict) and a[k] != b[k])


def test_copies_of_the_model_and_the_chat_file_elsewhere_keep_the_fingerprint(tmp_path, tiny_model_dir):
    chats = write_numbered_chats(tmp_path / "a" / "chats.jsonl")
    (tmp_path / "b" / "elsewhere").mkdir(parents=True)
    copy = shutil.copy(chats, tmp_path / "b" / "elsewhere" / "chats.jsonl")  # same name, same bytes
    moved_model = shutil.copytree(tiny_model_dir, tmp_path / "models" / "another-name")
    here = fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats), str(tiny_model_dir)))
    there = fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, Path(copy)), str(moved_model)))
    assert here == there
    identity = dataset_identity(jsonl_extract_config(tmp_path, chats), str(tiny_model_dir))
    stored = dataset_path(identity)
    assert stored == dataset_path(dataset_identity(jsonl_extract_config(tmp_path, Path(copy)), str(moved_model)))
    assert stored == tmp_path / "data" / f"tiny_llama-jsonl-{dataset_fingerprint(here)}"
    # the online dataset: the same inputs marked as token ids only, beside the stored one
    tokens = token_fingerprint_inputs(identity)
    assert tokens == {**here, "hidden_states": "online"}
    assert (
        token_dataset_path(identity, tokens) == stored.parent / f"tiny_llama-jsonl-tokens-{dataset_fingerprint(tokens)}"
    )
    # what does not make the stored bytes (capture batches, training, topology) leaves it as it is
    same = ["capture.batch_size=3", "capture.shard_max_tokens=1024", "train.lr=0.01", "topology.extract_tp=2"]
    assert (
        fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats, *same), str(tiny_model_dir))) == here
    )
    text = json.dumps(here)
    assert str(tmp_path) not in text and tiny_model_dir.name not in text  # no path, no directory name
    # the engine that would regenerate is not in it: every regen_backend gives one dataset
    regen = [
        fingerprint_inputs(
            dataset_identity(
                jsonl_extract_config(tmp_path, chats, "data.regenerate=true", f"data.regen_backend={b}"),
                str(tiny_model_dir),
            )
        )
        for b in ("auto", "hf", "vllm")
    ]
    assert regen[0] == regen[1] == regen[2] and "regen_backend" not in regen[0]["data"]
    assert regen[0]["data"]["regen_max_tokens"] == 512 and "generation_config_sha" in regen[0]["model"]
    assert not [k for k in here["data"] if k.startswith("regen_")]  # no regeneration: its settings change nothing
    assert "hf_split" not in here["data"]  # data=hf's fields are not read by the jsonl source


def test_other_chat_content_model_config_or_weights_change_it(tmp_path, tiny_model_dir):
    chats = write_numbered_chats(tmp_path / "chats.jsonl")
    base = fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats), str(tiny_model_dir)))
    write_numbered_chats(chats, answer="ANSWER")  # same size, new bytes (and mtime): the cached hash is not reused
    assert _changed(
        base, fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats), str(tiny_model_dir)))
    ) == ["data.content_sha"]

    write_numbered_chats(chats)
    assert fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats), str(tiny_model_dir))) == base
    other = shutil.copytree(tiny_model_dir, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5 * 2}))
    assert _changed(base, fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats), str(other)))) == [
        "model.config_sha"
    ]

    from safetensors.torch import load_file, save_file

    shutil.copy(tiny_model_dir / "config.json", other / "config.json")
    weights = load_file(str(other / "model.safetensors"))
    weights = {k: v + 1 if "embed_tokens" in k else v for k, v in weights.items()}  # a fine-tune of the embeddings
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    assert _changed(base, fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats), str(other)))) == [
        "model.weights"
    ]


def test_content_hashes_are_cached_by_path_size_and_mtime(tmp_path):
    file = tmp_path / "big.bin"
    file.write_bytes(os.urandom(6 << 20))
    hour_ago = file.stat().st_mtime_ns - 3600 * 10**9
    os.utime(file, ns=(hour_ago, hour_ago))  # a file written just now is hashed every time
    cache_file = tmp_path / "content_sha.json"
    sha = ContentShaCache(cache_file).sha(file, "sha256", file_sha256)
    assert sha == file_sha256(file)
    ((key, entry),) = json.loads(cache_file.read_text()).items()
    assert key == f"sha256:{file.resolve()}" and entry["size"] == 6 << 20
    # a remembered value is used as it is (the file is not read again) ...
    cache_file.write_text(json.dumps({key: {**entry, "sha": "remembered"}}))
    assert ContentShaCache(cache_file).sha(file, "sha256", file_sha256) == "remembered"
    # ... until the file's mtime (or size) says it changed
    os.utime(file, ns=(hour_ago, hour_ago + 1_000_000))
    assert ContentShaCache(cache_file).sha(file, "sha256", file_sha256) == sha

    # the sampled weight hash: size and windows from the first byte to the last
    before = sampled_file_sha(file)
    data = bytearray(file.read_bytes())
    data[-1] ^= 1
    file.write_bytes(bytes(data))
    flipped = sampled_file_sha(file)
    assert flipped != before
    with open(file, "ab") as f:
        f.write(b"\0")
    assert sampled_file_sha(file) != flipped


def test_first_scheme_datasets_are_found_where_written_and_named_elsewhere(tmp_path, tiny_model_dir, capsys):
    from eagle3.stages.extract import run as extract

    chats = write_numbered_chats(tmp_path / "chats.jsonl")
    cfg = jsonl_extract_config(tmp_path, chats)
    old_dir = legacy_dataset_path(dataset_identity(cfg, str(tiny_model_dir)))
    inputs = legacy_fingerprint_inputs(dataset_identity(cfg, str(tiny_model_dir)))
    assert old_dir.name.endswith(dataset_fingerprint(inputs)) and inputs["model"]["dir"] == tiny_model_dir.name
    old_dir.mkdir(parents=True)
    Manifest(
        fingerprint=dataset_fingerprint(inputs),
        fingerprint_inputs=canonical(inputs),
        layer_ids=[1, 2, 3, 4],
        hidden_size=64,
        dtype="bfloat16",
        complete=True,
    ).write(old_dir)
    found, note = locate_dataset(dataset_identity(cfg, str(tiny_model_dir)))
    assert found == old_dir and "first fingerprint scheme" in note
    assert extract(cfg) == str(old_dir)  # extract.py sees it complete too: nothing to capture again
    assert "already complete" in capsys.readouterr().err

    # the model moved: the first scheme's name no longer matches, and the error names that dataset
    moved_model = shutil.copytree(tiny_model_dir, tmp_path / "models" / "moved")
    with pytest.raises(DatasetNotFound) as err:
        locate_dataset(dataset_identity(cfg, str(moved_model)))
    msg = str(err.value)
    assert f"{old_dir}: named by the first fingerprint scheme" in msg and "model.dir" in msg
    assert f"use it with dataset_dir={old_dir}" in msg


def test_one_answer_per_conversation_keeps_the_fingerprint_more_answers_change_it(tmp_path, tiny_model_dir):
    """data.regen_num_answers=1 names the samples a regenerated dataset had before the option
    existed, so its fingerprint (and the dataset it finds) is unchanged; 3 answers are other data."""
    chats = write_numbered_chats(tmp_path / "chats.jsonl")
    regen = ["data.regenerate=true", "data.regen_temperature=0.7"]
    one = fingerprint_inputs(dataset_identity(jsonl_extract_config(tmp_path, chats, *regen), str(tiny_model_dir)))
    assert "regen_num_answers" not in one["data"]
    three = fingerprint_inputs(
        dataset_identity(jsonl_extract_config(tmp_path, chats, *regen, "data.regen_num_answers=3"), str(tiny_model_dir))
    )
    assert _changed(one, three) == ["data.regen_num_answers"] and three["data"]["regen_num_answers"] == 3
    legacy = legacy_fingerprint_inputs(
        dataset_identity(jsonl_extract_config(tmp_path, chats, *regen), str(tiny_model_dir))
    )
    assert "regen_num_answers" not in legacy["data"]
