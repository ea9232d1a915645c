"""The loader's read-ahead thread (``train.read_ahead``, eagle3/store/read_ahead.py): the same
batches in the same order as the step's own thread reads them, errors raised where the step
asks for the batch, no thread left behind by a run that stops mid-pass. train.py's head
unchanged by it: integration/test_read_ahead_train.py."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import write_random_dataset
from helpers.processes import read_ahead_threads

from eagle3.store import HiddenStateDataset
from eagle3.store.batch_options import BatchOrder, BatchShape
from eagle3.store.packing import pack_rows, packed_loader
from eagle3.store.read_ahead import ReadAheadLoader


def _batches(ds, read_ahead: int, **kw):
    batches = pack_rows(ds.lengths, 16, None)
    return packed_loader(ds, list(range(len(ds))), batches, shape=BatchShape(16), read_ahead=read_ahead, **kw)


def test_read_ahead_gives_the_batches_of_the_plain_loader_in_order(tmp_path):
    write_random_dataset(tmp_path, n=8)
    ds = HiddenStateDataset(tmp_path)
    plain, ahead = (
        _batches(ds, 0, order=BatchOrder(shuffle=True, seed=3)),
        _batches(ds, 2, order=BatchOrder(shuffle=True, seed=3)),
    )
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
    loader = packed_loader(_FailsAt(ds, 5), list(range(8)), batches, shape=BatchShape(64), read_ahead=3)
    it = iter(loader)
    got = [next(it), next(it)]  # batches 0 and 1 arrive whole, though the thread already failed
    assert [int(b["num_tokens"]) for b in got] == [sum(ds.lengths[i] for i in ids) for ids in batches[:2]]
    with pytest.raises(ValueError, match="sample 5: shard cut off"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_a_pass_stopped_early_leaves_no_reading_thread(tmp_path):
    """Lightning stops at max_steps in the middle of a pass: the thread, blocked on a full queue,
    ends when the iterator is closed or dropped."""
    write_random_dataset(tmp_path, n=8)
    ds = HiddenStateDataset(tmp_path)
    loader = _batches(ds, 1)
    it = iter(loader)
    next(it)
    it.close()
    assert not read_ahead_threads()
    it = iter(loader)
    next(it)
    del it
    deadline = time.monotonic() + 5
    while read_ahead_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not read_ahead_threads()
    with pytest.raises(ValueError, match="expected num_workers=0, got 2"):
        ReadAheadLoader(ds, num_workers=2)
    with pytest.raises(ValueError, match=r"read_ahead: expected >= 1 batches, got 0"):
        ReadAheadLoader(ds, read_ahead=0)
