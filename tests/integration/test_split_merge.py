"""Multi-node extraction on CPU: parts by shard_index/num_shards, merged into one dataset
that equals a single-run extraction of the same config (tiny Llama, real ShareGPT)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import compose

from eagle3.stages.extract import run as extract
from eagle3.store import HiddenStateDataset, Manifest, StoreError
from eagle3.store.merge import merge_parts, owner_shard, part_dir
from eagle3.util.launch import extraction_shard

TINY = ["experiment=tiny_test"]
N = 2


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """(single-run dataset dir, {i: part dir}) of the same config."""
    single_root, parts_root = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("parts")
    single = Path(extract(compose("extract", TINY + [f"paths.datasets_dir={single_root}"])))
    parts = {
        i: Path(
            extract(
                compose("extract", TINY + [f"paths.datasets_dir={parts_root}", f"shard_index={i}", f"num_shards={N}"])
            )
        )
        for i in range(N)
    }
    return single, parts


def _copy_parts(parts: dict[int, Path], root: Path, which=range(N)) -> Path:
    """Fresh copies of the parts under root; returns the final dataset dir they merge into."""
    final = root / parts[0].name.split(".part-")[0]
    for i in which:
        shutil.copytree(parts[i], part_dir(final, i, N))
    return final


def _merge_cli(root: Path) -> Path:
    return Path(extract(compose("extract", TINY + [f"paths.datasets_dir={root}", f"num_shards={N}", "merge=true"])))


def test_parts_split_the_samples_by_id(extracted):
    single, parts = extracted
    everything = Manifest.read(single)
    manifests = {i: Manifest.read(p) for i, p in parts.items()}
    for i, p in parts.items():
        assert p == part_dir(p.parent / single.name, i, N)  # <dataset dir>.part-<i>-of-<n>
        m = manifests[i]
        assert m.complete and m.fingerprint == everything.fingerprint  # fingerprinted like the dataset
        assert m.sample_ids and all(owner_shard(s, N) == i for s in m.sample_ids)
        assert set(m.val_ids) <= set(m.sample_ids)
    ids = [s for m in manifests.values() for s in m.sample_ids]
    assert len(ids) == len(set(ids)) and set(ids) == set(everything.sample_ids)
    assert sorted(v for m in manifests.values() for v in m.val_ids) == everything.val_ids


def test_merge_equals_the_single_run(extracted, tmp_path):
    single, parts = extracted
    _copy_parts(parts, tmp_path)
    merged_dir = _merge_cli(tmp_path)
    assert merged_dir.name == single.name  # train.py finds it from config alone
    a, b = HiddenStateDataset(single, verify="full"), HiddenStateDataset(merged_dir, verify="full")
    ma, mb = a.manifest, b.manifest
    assert (mb.num_samples, mb.num_tokens, mb.num_loss_tokens) == (ma.num_samples, ma.num_tokens, ma.num_loss_tokens)
    assert sorted(mb.sample_ids) == sorted(ma.sample_ids) and mb.val_ids == ma.val_ids
    assert [s.file for s in mb.shards] == [f"shard-{k:05d}.safetensors" for k in range(len(mb.shards))]
    assert torch.equal(b.token_freq(), a.token_freq())  # summed over parts
    assert b.vocab_sizes == a.vocab_sizes == [2048]
    for x, y in zip(a.load_vocab(2048), b.load_vocab(2048)):  # rebuilt from the summed counts
        assert torch.equal(x, y)
    index_b = {sid: i for i, sid in enumerate(b.sample_ids)}
    for i, sid in enumerate(a.sample_ids):
        x, y = a[i], b[index_b[sid]]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        # HF capture pads per batch and the parts batch differently: bf16 rounding only
        torch.testing.assert_close(y["hidden"].float(), x["hidden"].float(), rtol=0, atol=2e-3)
    assert not any(part_dir(merged_dir, i, N).exists() for i in range(N))  # parts removed


def test_merge_links_part_shards_without_copying(extracted, tmp_path):
    _, parts = extracted
    final = _copy_parts(parts, tmp_path)
    m = merge_parts(final, N, remove_parts=False)
    first_part = Manifest.read(part_dir(final, 0, N))
    src = part_dir(final, 0, N) / first_part.shards[0].file
    assert os.stat(final / m.shards[0].file).st_ino == os.stat(src).st_ino  # a hard link
    # merging again is a no-op that returns the same dataset (and may now remove the parts)
    again = merge_parts(final, N)
    assert again.sample_ids == m.sample_ids and not part_dir(final, 0, N).exists()


def test_merge_refuses_a_missing_part(extracted, tmp_path):
    _, parts = extracted
    final = _copy_parts(parts, tmp_path, which=[0])
    with pytest.raises(StoreError, match=r"shard_index=1 .*missing"):
        merge_parts(final, N)
    assert not final.exists() and part_dir(final, 0, N).is_dir()  # nothing half-made, the part kept


def test_merge_refuses_parts_of_another_config(extracted, tmp_path):
    _, parts = extracted
    final = _copy_parts(parts, tmp_path)
    other = final.with_name(final.name[:-16] + "0" * 16)  # same parts, another dataset's name
    for i in range(N):
        shutil.move(part_dir(final, i, N), part_dir(other, i, N))
    with pytest.raises(StoreError, match="fingerprint"):
        merge_parts(other, N)


def test_killed_merge_is_redone(extracted, tmp_path):
    _, parts = extracted
    final = _copy_parts(parts, tmp_path)
    leftover = final.with_name(final.name + ".merging")
    leftover.mkdir()
    (leftover / "shard-00000.safetensors").write_bytes(b"half a file")
    m = merge_parts(final, N)
    assert not leftover.exists()
    HiddenStateDataset(final, verify="full")  # every shard checks out
    assert m.complete and m.num_samples == sum(Manifest.read(p).num_samples for p in parts.values())


def test_srun_tasks_split_by_their_rank():
    srun = {
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NAME": "extract",
        "SLURM_NTASKS_PER_NODE": "4",
    }
    assert extraction_shard(1, 0, srun) == (4, 2)
    assert extraction_shard(3, 1, srun) == (3, 1)  # explicit config wins
    assert extraction_shard(1, 0, {}) == (1, 0)
    assert extraction_shard(1, 0, {**srun, "SLURM_JOB_NAME": "interactive"}) == (1, 0)  # an salloc shell
