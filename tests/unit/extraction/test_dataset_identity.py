"""The dataset fingerprint holds content, not places: copies of the model and of the chat file
elsewhere give the same dataset, other content another; the regeneration engine is recorded in
the manifest, not fingerprinted; moved datasets are taken with dataset_dir= (train.py and
evaluate); datasets named by the first scheme are found or named. Tiny random Llama, a few
chats written here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, compose
from helpers import write_numbered_chats

from eagle3.extraction.identity import (
    DatasetNotFound,
    check_regen_engine,
    dataset_path,
    fingerprint_inputs,
    legacy_dataset_path,
    legacy_fingerprint_inputs,
    locate_dataset,
    token_dataset_path,
    token_fingerprint_inputs,
)
from eagle3.stages.narrow import dataset_identity
from eagle3.store import FingerprintMismatchError, Manifest, dataset_fingerprint
from eagle3.store.fingerprint import canonical
from eagle3.util.hashing import ContentShaCache, file_sha256, sampled_file_sha

TINY = ["experiment=tiny_test"]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from eagle3.target_model.resolve import resolve_target

    return Path(resolve_target(compose("extract", TINY).model, ROOT / ".cache"))


def _cfg(tmp_path: Path, chats: Path, *more: str):
    return compose(
        "extract", TINY + ["data=jsonl", f"data.path={chats}", f"paths.datasets_dir={tmp_path / 'data'}", *more]
    )


def _changed(a: dict, b: dict) -> list[str]:
    return sorted(
        f"{k}.{kk}" for k in a if isinstance(a[k], dict) for kk in set(a[k]) | set(b[k]) if a[k].get(kk) != b[k].get(kk)
    ) + sorted(k for k in a if not isinstance(a[k], dict) and a[k] != b[k])


def test_copies_of_the_model_and_the_chat_file_elsewhere_keep_the_fingerprint(tmp_path, model_dir):
    chats = write_numbered_chats(tmp_path / "a" / "chats.jsonl")
    (tmp_path / "b" / "elsewhere").mkdir(parents=True)
    copy = shutil.copy(chats, tmp_path / "b" / "elsewhere" / "chats.jsonl")  # same name, same bytes
    moved_model = shutil.copytree(model_dir, tmp_path / "models" / "another-name")
    here = fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats), str(model_dir)))
    there = fingerprint_inputs(dataset_identity(_cfg(tmp_path, Path(copy)), str(moved_model)))
    assert here == there
    identity = dataset_identity(_cfg(tmp_path, chats), str(model_dir))
    stored = dataset_path(identity)
    assert stored == dataset_path(dataset_identity(_cfg(tmp_path, Path(copy)), str(moved_model)))
    assert stored == tmp_path / "data" / f"tiny_llama-jsonl-{dataset_fingerprint(here)}"
    # the online dataset: the same inputs marked as token ids only, beside the stored one
    tokens = token_fingerprint_inputs(identity)
    assert tokens == {**here, "hidden_states": "online"}
    assert (
        token_dataset_path(identity, tokens) == stored.parent / f"tiny_llama-jsonl-tokens-{dataset_fingerprint(tokens)}"
    )
    # what does not make the stored bytes (capture batches, training, topology) leaves it as it is
    same = ["capture.batch_size=3", "capture.shard_max_tokens=1024", "train.lr=0.01", "topology.extract_tp=2"]
    assert fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats, *same), str(model_dir))) == here
    text = json.dumps(here)
    assert str(tmp_path) not in text and model_dir.name not in text  # no path, no directory name
    # the engine that would regenerate is not in it: every regen_backend gives one dataset
    regen = [
        fingerprint_inputs(
            dataset_identity(_cfg(tmp_path, chats, "data.regenerate=true", f"data.regen_backend={b}"), str(model_dir))
        )
        for b in ("auto", "hf", "vllm")
    ]
    assert regen[0] == regen[1] == regen[2] and "regen_backend" not in regen[0]["data"]
    assert regen[0]["data"]["regen_max_tokens"] == 512 and "generation_config_sha" in regen[0]["model"]
    assert not [k for k in here["data"] if k.startswith("regen_")]  # no regeneration: its settings change nothing
    assert "hf_split" not in here["data"]  # data=hf's fields are not read by the jsonl source


def test_other_chat_content_model_config_or_weights_change_it(tmp_path, model_dir):
    chats = write_numbered_chats(tmp_path / "chats.jsonl")
    base = fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats), str(model_dir)))
    write_numbered_chats(chats, answer="ANSWER")  # same size, new bytes (and mtime): the cached hash is not reused
    assert _changed(base, fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats), str(model_dir)))) == [
        "data.content_sha"
    ]

    write_numbered_chats(chats)
    assert fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats), str(model_dir))) == base
    other = shutil.copytree(model_dir, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5 * 2}))
    assert _changed(base, fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats), str(other)))) == [
        "model.config_sha"
    ]

    from safetensors.torch import load_file, save_file

    shutil.copy(model_dir / "config.json", other / "config.json")
    weights = load_file(str(other / "model.safetensors"))
    weights = {k: v + 1 if "embed_tokens" in k else v for k, v in weights.items()}  # a fine-tune of the embeddings
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    assert _changed(base, fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats), str(other)))) == ["model.weights"]


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


def test_regenerated_dataset_records_its_engine_and_travels(tmp_path, model_dir, capsys):
    """extract with data.regenerate (hf engine): the manifest records the engine; train finds the
    dataset whatever regen_backend says, without the chat file, and after a move by dataset_dir=;
    evaluate's dataset_dir= takes the moved dataset's validation prompts."""
    from transformers import AutoTokenizer

    from eagle3.evaluation.prompts import VAL, heldout_prompts
    from eagle3.stages.compose import register_evaluate_config
    from eagle3.stages.extract import run as extract
    from eagle3.stages.train_inputs import find_dataset

    chats = write_numbered_chats(tmp_path / "chats" / "chats.jsonl")
    regen = [
        "data.regenerate=true",
        "data.regen_backend=hf",
        "data.regen_max_tokens=4",
        "data.max_samples=8",
        "data.val_fraction=0.5",
    ]
    ds_dir = Path(
        extract(
            compose(
                "extract",
                TINY + ["data=jsonl", f"data.path={chats}", *regen, f"paths.datasets_dir={tmp_path / 'data'}"],
            )
        )
    )
    manifest = Manifest.read(ds_dir)
    assert manifest.complete and manifest.provenance["regen_engine"] == "hf"
    assert manifest.provenance["data_path"] == str(chats.resolve())
    assert manifest.provenance["model_dir"] == str(model_dir.resolve())
    assert "regen_backend" not in manifest.fingerprint_inputs["data"]
    with pytest.raises(FingerprintMismatchError, match=r"regen_engine: expected vllm .* got hf.*data.regen_backend=hf"):
        check_regen_engine(ds_dir, "vllm")  # a resume by another engine would mix two engines' answers

    def train_cfg(*more: str, datasets_dir: Path = tmp_path / "data"):
        return compose(
            "train", TINY + ["data=jsonl", f"data.path={chats}", *regen, f"paths.datasets_dir={datasets_dir}", *more]
        )

    assert locate_dataset(dataset_identity(train_cfg("data.regen_backend=vllm"), str(model_dir))) == (ds_dir, None)
    hidden = chats.rename(tmp_path / "not-here.jsonl")
    found, note = locate_dataset(dataset_identity(train_cfg(), str(model_dir)))
    assert found == ds_dir and "chat data is not here to hash" in note and "matches the rest" in note
    hidden.rename(chats)

    moved = Path(shutil.move(str(ds_dir), tmp_path / "elsewhere" / "my_dataset"))
    with pytest.raises(DatasetNotFound, match="pass dataset_dir="):
        locate_dataset(dataset_identity(train_cfg(), str(model_dir)))
    capsys.readouterr()
    assert find_dataset(train_cfg(f"dataset_dir={moved}"), str(model_dir)) == moved.resolve()
    assert f"dataset {moved.resolve()}: answers regenerated by hf" in capsys.readouterr().out

    cli = subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), "export_dir=unused", f"dataset_dir={moved}", "--cfg", "job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0 and f"dataset_dir: {moved}" in cli.stdout, cli.stderr[-2000:]
    register_evaluate_config()
    evaluate_cfg = compose("evaluate", ["export_dir=unused", f"dataset_dir={moved}"])
    prompts = heldout_prompts(evaluate_cfg.dataset_dir, 4, 0, AutoTokenizer.from_pretrained(model_dir))
    val = prompts.by_source(VAL)
    assert val and [p.id for p in val] == manifest.val_ids[: len(val)]
    assert all(p.messages == [{"role": "user", "content": f"Say the number {p.id.split(':')[1]}."}] for p in val)


def test_first_scheme_datasets_are_found_where_written_and_named_elsewhere(tmp_path, model_dir, capsys):
    from eagle3.stages.extract import run as extract

    chats = write_numbered_chats(tmp_path / "chats.jsonl")
    cfg = _cfg(tmp_path, chats)
    old_dir = legacy_dataset_path(dataset_identity(cfg, str(model_dir)))
    inputs = legacy_fingerprint_inputs(dataset_identity(cfg, str(model_dir)))
    assert old_dir.name.endswith(dataset_fingerprint(inputs)) and inputs["model"]["dir"] == model_dir.name
    old_dir.mkdir(parents=True)
    Manifest(
        fingerprint=dataset_fingerprint(inputs),
        fingerprint_inputs=canonical(inputs),
        layer_ids=[1, 2, 3, 4],
        hidden_size=64,
        dtype="bfloat16",
        complete=True,
    ).write(old_dir)
    found, note = locate_dataset(dataset_identity(cfg, str(model_dir)))
    assert found == old_dir and "first fingerprint scheme" in note
    assert extract(cfg) == str(old_dir)  # extract.py sees it complete too: nothing to capture again
    assert "already complete" in capsys.readouterr().err

    # the model moved: the first scheme's name no longer matches, and the error names that dataset
    moved_model = shutil.copytree(model_dir, tmp_path / "models" / "moved")
    with pytest.raises(DatasetNotFound) as err:
        locate_dataset(dataset_identity(cfg, str(moved_model)))
    msg = str(err.value)
    assert f"{old_dir}: named by the first fingerprint scheme" in msg and "model.dir" in msg
    assert f"use it with dataset_dir={old_dir}" in msg


def test_one_answer_per_conversation_keeps_the_fingerprint_more_answers_change_it(tmp_path, model_dir):
    """data.regen_num_answers=1 names the samples a regenerated dataset had before the option
    existed, so its fingerprint (and the dataset it finds) is unchanged; 3 answers are other data."""
    chats = write_numbered_chats(tmp_path / "chats.jsonl")
    regen = ["data.regenerate=true", "data.regen_temperature=0.7"]
    one = fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats, *regen), str(model_dir)))
    assert "regen_num_answers" not in one["data"]
    three = fingerprint_inputs(
        dataset_identity(_cfg(tmp_path, chats, *regen, "data.regen_num_answers=3"), str(model_dir))
    )
    assert _changed(one, three) == ["data.regen_num_answers"] and three["data"]["regen_num_answers"] == 3
    legacy = legacy_fingerprint_inputs(dataset_identity(_cfg(tmp_path, chats, *regen), str(model_dir)))
    assert "regen_num_answers" not in legacy["data"]


def test_dataset_dir_of_other_weights_is_refused_unless_accepted(tmp_path, model_dir, capsys):
    """dataset_dir= of a dataset extracted from another target of the same shape (tiny Llama,
    model.seed=1: other weights, same config and tokenizer) is refused by train.py, stored or
    online, naming the manifest, the field, expected and got, and the flag that accepts it;
    dataset_other_weights=true accepts it with a line saying so; the same target passes."""
    from eagle3.stages.extract import run as extract
    from eagle3.stages.train_inputs import find_dataset, find_token_dataset
    from eagle3.target_model.resolve import resolve_target

    chats = write_numbered_chats(tmp_path / "chats.jsonl", n=8)
    stored = Path(extract(_cfg(tmp_path, chats)))
    tokens = Path(extract(_cfg(tmp_path, chats, "train.hidden_states=online")))
    other = ["model.seed=1"]
    other_dir = resolve_target(compose("train", TINY + other).model, ROOT / ".cache")
    assert Path(other_dir) != model_dir
    assert (Path(other_dir) / "config.json").read_bytes() == (model_dir / "config.json").read_bytes()

    def train_cfg(ds: Path, *more: str):
        return compose("train", TINY + [f"dataset_dir={ds}", f"paths.datasets_dir={tmp_path / 'data'}", *more])

    for ds, find, online in ((stored, find_dataset, []), (tokens, find_token_dataset, ["train.hidden_states=online"])):
        assert find(train_cfg(ds, *online), str(model_dir)) == ds.resolve()  # its own target
        with pytest.raises(
            FingerprintMismatchError,
            match=rf"dataset_dir={ds}: {ds.resolve()}/manifest.json: fingerprint_inputs.model.weights: expected "
            r"\{'model.safetensors': '[0-9a-f]{16}'\} \(the target's, .*\), got \{'model.safetensors': "
            r"'[0-9a-f]{16}'\}: it was extracted from another model's weights.*dataset_other_weights=true",
        ):
            find(train_cfg(ds, *online, *other), other_dir)
        capsys.readouterr()
        accepted = train_cfg(ds, *online, *other, "dataset_other_weights=true")
        assert find(accepted, other_dir) == ds.resolve()
        assert "accepted (dataset_other_weights=true)" in capsys.readouterr().out
