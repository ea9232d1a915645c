"""The loader's read-ahead thread (``train.read_ahead``, eagle3/store/read_ahead.py): the same
batches in the same order as the step's own thread reads them, errors raised where the step
asks for the batch, no thread left behind by a run that stops mid-pass, and train.py's head
unchanged by it."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from conftest import compose
from helpers import write_random_dataset
from safetensors.torch import load_file

from eagle3.store import HiddenStateDataset
from eagle3.store.packing import pack_rows, packed_loader
from eagle3.store.read_ahead import ReadAheadLoader


def _batches(ds, read_ahead: int, **kw):
    batches = pack_rows(ds.lengths, 16, None)
    return packed_loader(ds, list(range(len(ds))), batches, max_tokens=16, read_ahead=read_ahead, **kw)


def test_read_ahead_gives_the_batches_of_the_plain_loader_in_order(tmp_path):
    write_random_dataset(tmp_path, n=8)
    ds = HiddenStateDataset(tmp_path)
    plain, ahead = _batches(ds, 0, shuffle=True, seed=3), _batches(ds, 2, shuffle=True, seed=3)
    assert type(plain) is torch.utils.data.DataLoader and isinstance(ahead, ReadAheadLoader)
    assert len(ahead) == len(plain) > 2
    for _ in range(2):  # two passes: each pass its own shuffled order, the same in both
        here, there = list(plain), list(ahead)
        assert len(here) == len(there) == len(plain)
        for a, b in zip(here, there):
            assert set(a) == set(b)
            for key in a:
                assert torch.equal(a[key], b[key]), key


class _FailsAt:
    """A dataset whose sample ``bad`` cannot be read (a shard cut off under the run)."""

    def __init__(self, base, bad: int):
        self.base, self.bad = base, bad

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i}: shard cut off")
        return self.base[i]


def test_an_error_while_reading_ahead_is_raised_at_the_batch_that_needs_it(tmp_path):
    write_random_dataset(tmp_path, n=8)
    ds = HiddenStateDataset(tmp_path)
    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    loader = packed_loader(_FailsAt(ds, 5), list(range(8)), batches, max_tokens=64, read_ahead=3)
    it = iter(loader)
    got = [next(it), next(it)]  # batches 0 and 1 arrive whole, though the thread already failed
    assert [int(b["num_tokens"]) for b in got] == [sum(ds.lengths[i] for i in ids) for ids in batches[:2]]
    with pytest.raises(ValueError, match="sample 5: shard cut off"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "eagle3-read-ahead"]


def test_a_pass_stopped_early_leaves_no_reading_thread(tmp_path):
    """Lightning stops at max_steps in the middle of a pass: the thread, blocked on a full queue,
    ends when the iterator is closed or dropped."""
    write_random_dataset(tmp_path, n=8)
    ds = HiddenStateDataset(tmp_path)
    loader = _batches(ds, 1)
    it = iter(loader)
    next(it)
    it.close()
    assert not _reader_threads()
    it = iter(loader)
    next(it)
    del it
    deadline = time.monotonic() + 5
    while _reader_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _reader_threads()
    with pytest.raises(ValueError, match="expected num_workers=0, got 2"):
        ReadAheadLoader(ds, num_workers=2)
    with pytest.raises(ValueError, match=r"read_ahead: expected >= 1 batches, got 0"):
        ReadAheadLoader(ds, read_ahead=0)


def test_train_py_with_read_ahead_trains_the_same_head(tmp_path):
    """The real train.py on the tiny target: the head reading ahead equals, weight for weight,
    the head whose step thread read its own batches."""
    from eagle3.stages.extract import run as extract
    from eagle3.stages.train import run as train

    args = ["experiment=tiny_test", "eval.enabled=false", f"paths.datasets_dir={tmp_path / 'data'}"]
    extract(compose("extract", args))
    heads, losses = [], []
    for read_ahead in (0, 2):
        out = tmp_path / f"run{read_ahead}"
        train(compose("train", [*args, f"train.read_ahead={read_ahead}"], output_dir=str(out)))
        summary = json.loads((out / "summary.json").read_text())
        heads.append(load_file(str(out / "export" / "model.safetensors")))
        losses.append(summary["final"]["val/loss"])
    assert losses[0] == losses[1]
    assert set(heads[0]) == set(heads[1])
    for name in heads[0]:
        assert torch.equal(heads[0][name], heads[1][name]), name
    assert not _reader_threads()
