"""A complete dataset with one shard cut short, deleted, its header overwritten or a bit flipped:
extract.py redoes that shard, and only it, from the samples the manifest lists for it, and the
dataset is byte for byte the one before the damage (tiny random Llama, real ShareGPT).
train.py refuses the damaged dataset naming the extract.py command that repairs it, and that
command, run as printed, does."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import compose
from helpers.faults import ARGS, cli, copy_dataset, file_bytes

from eagle3.stages.extract import run as extract
from eagle3.stages.train import run as train
from eagle3.store import DamagedDatasetError, Manifest


@pytest.fixture(scope="module")
def original(reference_dataset) -> Path:
    return reference_dataset


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "delete":
        path.unlink()
    elif how == "bitflip":  # inside the hidden states: same size, valid header
        data[-5] ^= 0x10
        path.write_bytes(bytes(data))
    elif how == "header":  # the JSON header overwritten in place: same size, unparsable
        data[8:24] = b"\xff" * 16
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "delete", "header", "bitflip"])
def test_a_damaged_shard_is_redone_in_place(original, tmp_path, how, capsys):
    ds = copy_dataset(original, tmp_path)
    before = file_bytes(ds)
    shards = [ds / s.file for s in Manifest.read(ds).shards]
    assert len(shards) >= 3
    victim = shards[1]
    untouched = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in shards if p != victim}
    _damage(victim, how)
    args = ARGS + [f"paths.datasets_dir={tmp_path}"]

    if how == "bitflip":  # the default check (size, header) cannot see it; train.py would not either
        extract(compose("extract", args))
        assert "nothing to do" in capsys.readouterr().err
        assert file_bytes(ds)[victim.name] != before[victim.name]
        args.append("capture.verify=full")
    else:  # train.py refuses, and says how to repair it
        with pytest.raises(DamagedDatasetError, match=rf"{victim.name}: .*; repair it with: python extract.py") as e:
            train(compose("train", args, output_dir=str(tmp_path / "run")))
        assert e.value.needs_hash == (how == "header")
        assert ("capture.verify=full" in str(e.value)) == (how == "header")

    extract(compose("extract", args))
    err = capsys.readouterr().err
    assert f"repairing {victim.name}" in err and err.count("repairing") == 1
    # every shard, the manifest, token_freq and the vocabulary; the manifest's record of the
    # extraction's seconds adds the repair's
    after = file_bytes(ds)
    spent = [json.loads(m["manifest.json"])["provenance"].pop("extract_seconds") for m in (before, after)]
    assert spent[1] > spent[0]
    runs = [json.loads(m["manifest.json"])["provenance"]["captures"] for m in (before, after)]
    assert runs[1] == [*runs[0], {"route": "hf", "run": "repair"}]  # the repair's run is kept
    assert _without_seconds(after) == _without_seconds(before)
    for p in shards:  # only the damaged shard was written again
        if p != victim:
            assert (p.stat().st_ino, p.stat().st_mtime_ns) == untouched[p.name], p.name
    extract(compose("extract", args))
    assert "nothing to do" in capsys.readouterr().err


def test_train_prints_the_command_that_repairs_it_and_that_command_does(original, tmp_path):
    root = tmp_path / "data"
    ds = copy_dataset(original, root)
    before = file_bytes(ds)
    victim = ds / Manifest.read(ds).shards[0].file
    size = victim.stat().st_size
    _damage(victim, "truncate")

    refused = cli(["train.py", *ARGS, f"paths.datasets_dir={root}", f"hydra.run.dir={tmp_path / 'run'}"])
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert f"{victim.name}: size: expected {size} bytes, got {size // 2} bytes" in out, out[-3000:]
    command = re.search(r"repair it with: (python extract\.py[^\n]*)", out)
    assert command, out[-3000:]
    words = shlex.split(command.group(1))
    assert words[2:] == [*ARGS, f"paths.datasets_dir={root}"]  # this run's overrides, nothing else

    fixed = cli(words[1:])  # the printed command, with this interpreter as `python`
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert f"repairing {victim.name}" in fixed.stderr
    assert _without_seconds(file_bytes(ds)) == _without_seconds(before)  # the repair adds its seconds
    assert sys.executable  # the command ran under the same venv as the suite


def _without_seconds(files: dict[str, bytes]) -> dict:
    """The files, the manifest parsed without provenance.extract_seconds (what a repair adds to)
    and provenance.captures (each repair appends its run)."""
    manifest = json.loads(files["manifest.json"])
    manifest["provenance"].pop("extract_seconds", None)
    manifest["provenance"].pop("captures", None)
    return {**files, "manifest.json": manifest}


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> Path:
    """A dataset extracted in two parts (shard_index=0/1 num_shards=2) and merged."""
    from eagle3.store.merge import part_dir

    root = tmp_path_factory.mktemp("merged")
    args = ARGS + [f"paths.datasets_dir={root}"]
    for i in range(2):
        extract(compose("extract", args + [f"shard_index={i}", "num_shards=2"]))
    ds = Path(extract(compose("extract", args + ["num_shards=2", "merge=true"])))
    assert not part_dir(ds, 0, 2).exists()
    return ds


@pytest.mark.parametrize("damaged_parts", [[1], [0, 1]])
def test_one_nodes_command_repairs_a_merged_dataset_changing_only_the_damaged_shards(
    merged, tmp_path, damaged_parts, capsys
):
    """A dataset extracted in two parts and merged, a shard of node 1's part (and one of node
    0's) cut short: node 1's command (shard_index=1 num_shards=2) redoes them, and the dataset
    is the merged one byte for byte: its validation ids, token counts and vocabulary those of
    the whole, not rebuilt from node 1's part."""
    from eagle3.store.merge import part_dir

    root = tmp_path / "data"
    ds = copy_dataset(merged, root)
    args = ARGS + [f"paths.datasets_dir={root}"]
    before = file_bytes(ds)
    manifest = Manifest.read(ds)
    owners = _owners(manifest)
    by_part = {owner: [s.file for s in manifest.shards if owners[s.file] == owner] for owner in range(2)}
    victims = [by_part[part][-1] for part in damaged_parts]
    for file in victims:
        _damage(ds / file, "truncate")
    capsys.readouterr()

    extract(compose("extract", args + ["shard_index=1", "num_shards=2"]))
    err = capsys.readouterr().err
    assert all(f"repairing {f}" in err for f in victims) and err.count("repairing") == len(victims)
    assert _without_seconds(file_bytes(ds)) == _without_seconds(before)
    assert not part_dir(ds, 1, 2).exists()  # the merged dataset was repaired, no part written
    extract(compose("extract", args + ["shard_index=0", "num_shards=2"]))
    assert "nothing to do" in capsys.readouterr().err


def _owners(manifest: Manifest) -> dict[str, int]:
    """{shard file: the part (of 2) whose samples it holds} of a merged dataset."""
    from eagle3.store.merge import owner_shard

    out, first = {}, 0
    for shard in manifest.shards:
        owners = {owner_shard(s, 2) for s in manifest.sample_ids[first : first + shard.num_samples]}
        assert len(owners) == 1
        out[shard.file], first = owners.pop(), first + shard.num_samples
    return out


def test_repairing_a_budget_cut_dataset_keeps_its_cut(tmp_path, monkeypatch, capsys):
    """A dataset a time budget cut at 12 of 40 samples, one shard deleted: the repair captures
    that shard's samples and nothing the budget cut; the dataset, provenance.budget_cut included,
    is the one before the damage byte for byte."""
    from helpers import TickingClock

    from eagle3.planning import time_budget
    from eagle3.util.clock import Deadline

    clock = TickingClock()
    monkeypatch.setattr(time_budget, "capture_deadline", lambda split, _, n: Deadline(clock, 13.0, "capture"))
    args = ARGS + ["time_budget.minutes=1.5", f"paths.datasets_dir={tmp_path}"]
    ds = Path(extract(compose("extract", args)))
    cut = Manifest.read(ds)
    assert cut.num_samples == cut.provenance["budget_cut"]["samples"] == 12 and len(cut.shards) >= 2
    before = file_bytes(ds)
    victim = ds / cut.shards[-1].file
    _damage(victim, "delete")
    capsys.readouterr()

    extract(compose("extract", args))
    err = capsys.readouterr().err
    assert f"repairing {victim.name}" in err
    repaired = Manifest.read(ds)
    assert repaired.num_samples == 12 and repaired.provenance["budget_cut"] == cut.provenance["budget_cut"]
    assert _without_seconds(file_bytes(ds)) == _without_seconds(before)
