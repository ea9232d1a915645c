"""The dataset directory: round trip, crash/resume, corruption, identity, disk checks."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from eagle3.store import (
    DiskSpaceError,
    FingerprintMismatchError,
    HiddenStateDataset,
    IncompleteDatasetError,
    ShardWriter,
    StoreError,
    add_vocab,
    check_free_disk,
    dataset_dir,
    dataset_fingerprint,
    disk_needed_bytes,
)
from eagle3.store.batch_options import BatchShape
from eagle3.store.write_options import ExistingShards, WriteOptions
from eagle3.target_model.adapter import CapturedSample

LAYER_IDS = (1, 2, 4)
H = 8
DT = torch.bfloat16
INPUTS = {"model": "tiny", "layer_ids": list(LAYER_IDS), "dtype": "bfloat16", "data": {"max_length": 64}}
TARGET_VOCAB = 50


def make_sample(i: int) -> CapturedSample:
    g = torch.Generator().manual_seed(i)
    T = 3 + (i * 7) % 11
    return CapturedSample(
        token_ids=torch.randint(0, TARGET_VOCAB, (T,), generator=g),
        loss_mask=torch.rand(T, generator=g) > 0.4,
        hidden=torch.randn(T, len(LAYER_IDS), H, generator=g).to(DT),
    )


def writer(path, **kw) -> ShardWriter:
    kw.setdefault("fingerprint_inputs", INPUTS)
    kw.setdefault("write", WriteOptions(shard_max_tokens=40))
    return ShardWriter(path, layer_ids=LAYER_IDS, hidden_size=H, dtype=DT, **kw)


def vocab(V: int = 5):
    t2d = torch.zeros(TARGET_VOCAB, dtype=torch.bool)
    ids = torch.tensor([3, 7, 8, 20, 41][:V])
    t2d[ids] = True
    return ids - torch.arange(V), t2d


def finish(w: ShardWriter):
    return w.finish(torch.arange(TARGET_VOCAB), {5: vocab()})


def assert_matches(ds: HiddenStateDataset, ids: list[int]):
    got = {ds.sample_id(i): ds[i] for i in range(len(ds))}
    assert sorted(got) == sorted(f"s{i}" for i in ids)
    for i in ids:
        want, rec = make_sample(i), got[f"s{i}"]
        assert torch.equal(rec["input_ids"], want.token_ids)
        assert torch.equal(rec["loss_mask"], want.loss_mask)
        assert rec["hidden"].dtype == DT and torch.equal(rec["hidden"], want.hidden)


def test_round_trip_across_shards(tmp_path):
    w = writer(tmp_path)
    for i in range(20):
        w.add(f"s{i}", make_sample(i))
    m = finish(w)
    total = sum(make_sample(i).num_tokens for i in range(20))
    assert len(m.shards) > 3 and all(s.num_tokens <= 40 or s.num_samples == 1 for s in m.shards)
    assert (m.num_samples, m.num_tokens) == (20, total)
    assert m.num_loss_tokens == sum(int(make_sample(i).loss_mask.sum()) for i in range(20))

    ds = HiddenStateDataset(tmp_path)
    assert len(ds) == 20 and ds.sample_ids == [f"s{i}" for i in range(20)]  # input order kept
    assert ds.lengths.tolist() == [make_sample(i).num_tokens for i in range(20)]
    assert ds.layer_ids == LAYER_IDS and ds.hidden_size == H and ds.dtype == DT
    assert_matches(ds, list(range(20)))
    assert torch.equal(ds.token_freq(), torch.arange(TARGET_VOCAB))
    d2t, t2d = ds.load_vocab(5)
    assert torch.equal(d2t, vocab()[0]) and torch.equal(t2d, vocab()[1])
    with pytest.raises(StoreError, match=r"no draft vocabulary of size 4; have \[5\]"):
        ds.load_vocab(4)
    # the manifest is the documented JSON, and a pickled dataset (DataLoader workers) reads
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert raw["complete"] and raw["layer_ids"] == list(LAYER_IDS) and raw["dtype"] == "bfloat16"
    assert raw["fingerprint"] == dataset_fingerprint(INPUTS) and raw["fingerprint_inputs"] == INPUTS
    assert {"file", "sha256", "size_bytes", "num_samples", "num_tokens"} <= set(raw["shards"][0])
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[7]["hidden"], ds[7]["hidden"])


def test_add_vocab_and_vocab_validation(tmp_path):
    w = writer(tmp_path)
    w.add("s0", make_sample(0))
    finish(w)
    d2t, t2d = vocab(4)
    add_vocab(tmp_path, 4, d2t, t2d)
    assert HiddenStateDataset(tmp_path).vocab_sizes == [4, 5]
    bad = t2d.clone()
    bad[0] = True
    with pytest.raises(StoreError, match="t2d: expected 4 true entries, got 5"):
        add_vocab(tmp_path, 4, d2t, bad)


CRASHING_CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from test_store import writer, make_sample
    w = writer({path!r})
    for i in range(12):
        w.add(f"s{{i}}", make_sample(i))
    durable = sorted(w.done_ids())
    print(",".join(durable), flush=True)
    # a shard half-written at the moment of the kill
    open({path!r} + "/shard-00099.safetensors.tmp-12345", "wb").write(b"partial")
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_resume_after_kill(tmp_path):
    path = str(tmp_path / "ds")
    code = CRASHING_CHILD.format(tests=os.path.dirname(__file__), path=path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    durable = set(proc.stdout.strip().split(","))
    assert 0 < len(durable) < 12  # some shards flushed, the rest was pending in memory

    w = writer(path)  # the lock died with the process
    assert w.done_ids() == durable
    assert w.removed_temp == ["shard-00099.safetensors.tmp-12345"]
    assert not any(".tmp-" in p.name for p in (tmp_path / "ds").iterdir())
    with pytest.raises(IncompleteDatasetError, match="re-run extract.py"):
        HiddenStateDataset(path)
    for i in range(12):
        if f"s{i}" not in w.done_ids():
            w.add(f"s{i}", make_sample(i))
    finish(w)
    assert_matches(HiddenStateDataset(path), list(range(12)))


def test_shard_renamed_but_not_in_manifest_is_adopted(tmp_path):
    w = writer(tmp_path)
    for i in range(6):
        w.add(f"s{i}", make_sample(i))
    w.flush()
    before = (tmp_path / "manifest.json").read_bytes()
    for i in range(6, 9):
        w.add(f"s{i}", make_sample(i))
    w.flush()  # killed right after the rename: the manifest update never happened
    (tmp_path / "manifest.json").write_bytes(before)
    del w

    w = writer(tmp_path)
    assert w.adopted and w.done_ids() == {f"s{i}" for i in range(9)}
    finish(w)
    assert_matches(HiddenStateDataset(tmp_path), list(range(9)))


def test_truncated_shard_is_detected_and_redone(tmp_path):
    w = writer(tmp_path)
    for i in range(15):
        w.add(f"s{i}", make_sample(i))
    m = finish(w)
    victim = tmp_path / m.shards[1].file
    lost = set(HiddenStateDataset(tmp_path).sample_ids[m.shards[0].num_samples :][: m.shards[1].num_samples])
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])

    with pytest.raises(StoreError, match=r"size: expected \d+ bytes, got \d+"):
        HiddenStateDataset(tmp_path)  # the reader refuses a damaged dataset outright
    w = writer(tmp_path)
    assert [f for f, _ in w.dropped] == [victim.name] and "truncated" in w.dropped[0][1]
    assert w.done_ids() == {f"s{i}" for i in range(15)} - lost and not w.complete
    for sid in sorted(lost):
        w.add(sid, make_sample(int(sid[1:])))
    finish(w)
    assert_matches(HiddenStateDataset(tmp_path), list(range(15)))


def test_corrupt_bytes_are_caught_by_full_verify_only(tmp_path):
    w = writer(tmp_path)
    for i in range(8):
        w.add(f"s{i}", make_sample(i))
    m = finish(w)
    victim = tmp_path / m.shards[0].file
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit inside the hidden states: same size, valid header
    victim.write_bytes(bytes(data))
    fast = writer(tmp_path, existing=ExistingShards("fast"))
    assert fast.dropped == []
    fast.close()
    full = writer(tmp_path)
    assert [f for f, _ in full.dropped] == [victim.name] and "sha256" in full.dropped[0][1]


def test_different_fingerprint_refuses(tmp_path):
    w = writer(tmp_path)
    w.add("s0", make_sample(0))
    w.close()
    other = dict(INPUTS, data={"max_length": 128})
    with pytest.raises(FingerprintMismatchError, match=r"inputs that differ: \['data'\]"):
        writer(tmp_path, fingerprint_inputs=other)
    assert writer(tmp_path).done_ids() == {"s0"}  # refused without touching anything


def test_second_writer_is_locked_out_and_duplicates_refused(tmp_path):
    w = writer(tmp_path)
    with pytest.raises(StoreError, match="another extraction is writing"):
        writer(tmp_path)
    w.add("s0", make_sample(0))
    with pytest.raises(StoreError, match="'s0' is already in the dataset"):
        w.add("s0", make_sample(0))
    bad = make_sample(1)
    bad.hidden = bad.hidden.float()
    with pytest.raises(
        StoreError, match=r"sample 's1' hidden: expected torch.bfloat16 \[10, 3, 8\], got torch.float32"
    ):
        w.add("s1", bad)
    w.close()


def test_incomplete_or_missing_dataset_refuses_to_open(tmp_path):
    with pytest.raises(StoreError, match="no manifest; not a dataset directory"):
        HiddenStateDataset(tmp_path)
    w = writer(tmp_path)
    w.add("s0", make_sample(0))
    w.close()
    with pytest.raises(IncompleteDatasetError, match=r"1 samples in 1 shards.*re-run extract.py"):
        HiddenStateDataset(tmp_path)


def test_fingerprint_is_canonical_and_dir_is_named_by_it(tmp_path):
    a = dataset_fingerprint({"b": [1, 2], "a": torch.bfloat16, "p": tmp_path})
    b = dataset_fingerprint({"p": str(tmp_path), "a": "bfloat16", "b": (1, 2)})
    assert a == b and len(a) == 16
    assert a != dataset_fingerprint({"b": [2, 1], "a": "bfloat16", "p": str(tmp_path)})
    with pytest.raises(StoreError, match=r"fingerprint inputs.x: expected JSON-like data.*got object"):
        dataset_fingerprint({"x": object()})
    assert dataset_dir(tmp_path, "smollm2/135m", a) == tmp_path / f"smollm2_135m-{a}"


def test_disk_estimate_and_refusal(tmp_path):
    # SmolLM2: 4 layers x 576 x 2 B per token, plus ids and mask
    need = disk_needed_bytes(1_000_000, 4, 576, torch.bfloat16)
    assert 1_000_000 * 4 * 576 * 2 < need < 1_000_000 * (4 * 576 * 2 + 20)
    free = shutil.disk_usage(tmp_path).free
    assert check_free_disk(tmp_path / "not" / "yet", free // 4, margin=1.1) > free // 4 * 1.1
    with pytest.raises(DiskSpaceError, match=r"not enough disk: need .* \(.* x margin 1.1\), free "):
        check_free_disk(tmp_path / "new", free * 2, margin=1.1)


def test_shard_is_what_safetensors_writes_and_its_sha256_is_of_the_written_bytes(tmp_path):
    """Hashing while writing: the manifest's sha256 is the sha256 of the file on disk, and the
    file is the one safetensors would write for the concatenated tensors."""
    import hashlib
    import struct

    from safetensors.torch import load_file, save

    w = writer(tmp_path)
    for i in range(4):
        w.add(f"s{i}", make_sample(i))
    info = w.flush()
    data = (tmp_path / info.file).read_bytes()
    assert info.sha256 == hashlib.sha256(data).hexdigest() and info.size_bytes == len(data)
    loaded = load_file(str(tmp_path / info.file))
    samples = [make_sample(i) for i in range(4)]
    assert torch.equal(loaded["hidden"], torch.cat([s.hidden for s in samples]))
    assert torch.equal(
        loaded["offsets"], torch.tensor([0, *torch.cumsum(torch.tensor([s.num_tokens for s in samples]), 0).tolist()])
    )
    head_len = struct.unpack("<Q", data[:8])[0]
    meta = json.loads(data[8 : 8 + head_len])["__metadata__"]
    ref = save({k: v.contiguous() for k, v in loaded.items()}, metadata=meta)
    ref_len = struct.unpack("<Q", ref[:8])[0]
    assert head_len == ref_len and json.loads(ref[8 : 8 + ref_len]) == json.loads(data[8 : 8 + head_len])
    assert ref[8 + ref_len :] == data[8 + head_len :]  # the tensor bytes, in the same order
    w.close()


def test_background_writer_round_trip_with_full_verify(tmp_path):
    w = writer(tmp_path, write=WriteOptions(40, background=True))
    for i in range(20):
        w.add(f"s{i}", make_sample(i))
    with pytest.raises(StoreError, match="'s3' is already in the dataset"):
        w.add("s3", make_sample(3))  # in a shard on the writer thread, or pending: still refused
    m = finish(w)
    assert len(m.shards) > 2 and m.num_samples == 20
    again = writer(tmp_path, existing=ExistingShards("full"))  # every shard's sha256 checked against the manifest
    assert not again.dropped and again.done_ids() == {f"s{i}" for i in range(20)}
    again.close()
    assert_matches(HiddenStateDataset(tmp_path), list(range(20)))


def test_background_write_failure_is_raised_by_the_next_call(tmp_path):
    path = tmp_path / "ds"
    w = writer(path, write=WriteOptions(40, background=True))
    w.add("s0", make_sample(0))
    shutil.rmtree(path)  # the disk under the writer goes away: the thread's write fails
    with pytest.raises(StoreError, match=r"writing a shard failed on the writer thread: FileNotFoundError"):
        for i in range(1, 12):  # shards fill up and are handed over; a later add reports the failure
            w.add(f"s{i}", make_sample(i))
        w.flush()
    w.close()  # already reported: unlocks without raising again
    assert w.done_ids() == set()


def test_parallel_writer_threads_give_the_sync_dataset_in_shard_order(tmp_path):
    """Several writer threads finish shards out of order; the manifest still lists shards and
    sample ids by shard index, byte for byte what a synchronous writer produces."""
    import time as _time

    from eagle3.store import shard_file

    real = shard_file.save_concatenated_hashing

    def slow_even_shards(final, parts, metadata):  # shard 0, 2, 4 finish after their successors
        if int(final.name.split("-")[1].split(".")[0]) % 2 == 0:
            _time.sleep(0.2)
        return real(final, parts, metadata)

    sync = writer(tmp_path / "sync")
    for i in range(30):
        sync.add(f"s{i}", make_sample(i))
    ref = finish(sync)
    shard_file.save_concatenated_hashing = slow_even_shards
    try:
        w = writer(tmp_path / "par", write=WriteOptions(40, background=True, writer_threads=3))
        for i in range(30):
            w.add(f"s{i}", make_sample(i))
        m = finish(w)
    finally:
        shard_file.save_concatenated_hashing = real
    assert [s.file for s in m.shards] == [s.file for s in ref.shards] and len(m.shards) >= 4
    assert m.sample_ids == ref.sample_ids == [f"s{i}" for i in range(30)]
    assert [s.sha256 for s in m.shards] == [s.sha256 for s in ref.shards]
    assert_matches(HiddenStateDataset(tmp_path / "par"), list(range(30)))
    with pytest.raises(StoreError, match="writer_threads: expected >= 1, got 0"):
        writer(tmp_path / "bad", write=WriteOptions(40, writer_threads=0))


def test_an_all_validation_dataset_is_refused_for_training_but_measurable(tmp_path):
    """A held-out set split like the training run's (val by id) can be all validation:
    training refuses it by name, measuring it (replay_export) does not."""
    from eagle3.training.datamodule import Eagle3DataModule

    w = writer(tmp_path / "ds")
    for i in range(4):
        w.add(f"s{i}", make_sample(i))
    w.finish(torch.arange(TARGET_VOCAB), {5: vocab()}, val_ids=[f"s{i}" for i in range(4)])
    with pytest.raises(ValueError, match=r"no training samples \(all 4 are validation\)"):
        Eagle3DataModule(str(tmp_path / "ds"), shape=BatchShape(64))
    dm = Eagle3DataModule(str(tmp_path / "ds"), shape=BatchShape(64), require_train=False)
    assert dm.val_idx == [0, 1, 2, 3] and dm.train_idx == []
    batches = list(dm.loader_for(dm.val_idx))
    assert sum(int(b["loss_mask"].numel()) for b in batches) == sum(make_sample(i).num_tokens for i in range(4))
