"""Shards read as views of the file mapped in memory (shard_file.map_shard): the values
safetensors reads, a tensor laid out off its alignment read whole, rows that a caller changes
changed in that process only (the file and other readers untouched)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from helpers import write_random_dataset
from safetensors import safe_open

from eagle3.store import HiddenStateDataset
from eagle3.store.shard_file import map_shard


def test_mapped_tensors_equal_what_safetensors_reads(tmp_path):
    write_random_dataset(tmp_path, n=6)
    ds = HiddenStateDataset(tmp_path)
    for info in ds.manifest.shards:
        views = map_shard(tmp_path / info.file)
        with safe_open(str(tmp_path / info.file), framework="pt") as f:
            assert set(views) == set(f.keys())
            for name in f.keys():
                want = f.get_tensor(name)
                assert views[name].dtype == want.dtype and views[name].shape == want.shape, name
                assert torch.equal(views[name], want), name


def test_a_tensor_off_its_alignment_is_read_whole(tmp_path):
    """A file whose bf16 tensor starts at an odd byte (a writer other than safetensors' order)."""
    mask = torch.tensor([True, False, True])  # 3 bytes: the next tensor starts at an odd offset
    values = torch.randn(4, 2).to(torch.bfloat16)
    header = {
        "loss_mask": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]},
        "hidden": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [3, 3 + values.numel() * 2]},
    }
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-aligned, as in safetensors
    path = tmp_path / "odd.safetensors"
    path.write_bytes(
        struct.pack("<Q", len(head)) + head + mask.numpy().tobytes() + values.view(torch.uint8).numpy().tobytes()
    )
    views = map_shard(path)
    assert torch.equal(views["loss_mask"], mask)
    assert views["hidden"].dtype == torch.bfloat16 and torch.equal(views["hidden"], values)


def test_a_row_changed_by_its_reader_leaves_the_file_and_other_readers_alone(tmp_path):
    write_random_dataset(tmp_path, n=6)
    shard = tmp_path / HiddenStateDataset(tmp_path).manifest.shards[0].file
    before = shard.read_bytes()
    mine, other = HiddenStateDataset(tmp_path), HiddenStateDataset(tmp_path)
    want = other[0]["hidden"].clone()
    row = mine[0]["hidden"]
    row.fill_(7.0)  # copy-on-write: this process's page only
    assert shard.read_bytes() == before
    assert torch.equal(other[0]["hidden"], want)
    assert torch.equal(HiddenStateDataset(tmp_path)[0]["hidden"], want)


def test_a_shard_whose_header_was_overwritten_is_refused_naming_it(tmp_path):
    """The same size (the cheap check passes), its header's JSON overwritten in place."""
    from eagle3.store.reader import DamagedDatasetError

    write_random_dataset(tmp_path, n=6)
    shard = tmp_path / HiddenStateDataset(tmp_path).manifest.shards[0].file
    raw = bytearray(shard.read_bytes())
    raw[8:24] = b"\x00" * 16
    shard.write_bytes(bytes(raw))
    with pytest.raises(DamagedDatasetError, match=rf"{shard.name}: unreadable safetensors file"):
        HiddenStateDataset(tmp_path)
