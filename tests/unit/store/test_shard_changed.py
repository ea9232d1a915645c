"""A shard changed on disk while a dataset reads it (``cp`` or ``rsync --inplace`` over a shared
dataset during training, a file cut short on NFS) is refused naming the shard, before its
mapping is touched: a read of a mapped page past a file's new end is a SIGBUS, which killed the
training with no file named. The reads run in a child process, so that a SIGBUS kills it, not
the test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT

CHANGE_A_MAPPED_SHARD = textwrap.dedent("""
    import os, sys, torch
    from eagle3.store import HiddenStateDataset, ShardWriter
    from eagle3.store.write_options import WriteOptions
    from eagle3.target_model.adapter import CapturedSample

    path, how = sys.argv[1], sys.argv[2]
    inputs = {"model": "tiny", "layer_ids": [1, 2, 4], "dtype": "bfloat16", "data": {"max_length": 64}}
    w = ShardWriter(path, layer_ids=(1, 2, 4), hidden_size=256, dtype=torch.bfloat16,
                    fingerprint_inputs=inputs, write=WriteOptions(shard_max_tokens=10_000))
    for i in range(4):  # one shard of about 300 KB: many pages
        g = torch.Generator().manual_seed(i)
        w.add(f"s{i}", CapturedSample(token_ids=torch.randint(0, 50, (50,), generator=g),
                                      loss_mask=torch.ones(50, dtype=torch.bool),
                                      hidden=torch.randn(50, 3, 256, generator=g).to(torch.bfloat16)))
    w.finish(torch.arange(50), {})
    ds = HiddenStateDataset(path)
    first = ds[0]["hidden"].float().sum()  # mapped and read
    shard = os.path.join(path, ds.manifest.shards[0].file)
    if how == "shrunk":
        with open(shard, "r+b") as f:  # as cp or rsync --inplace does before writing the new bytes
            f.truncate(8192)
    else:  # rewritten in place at the same size
        with open(shard, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"abcd")
        os.utime(shard, ns=(os.stat(shard).st_atime_ns, os.stat(shard).st_mtime_ns + 1_000_000))
    try:
        print(float(ds[3]["hidden"].float().sum()))
    except Exception as e:
        print(f"{type(e).__name__}: {e}")
""")


def _run(tmp_path, how: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHANGE_A_MAPPED_SHARD, str(tmp_path / "ds"), how],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_mapped_shard_cut_short_is_refused_naming_it(tmp_path):
    done = _run(tmp_path, "shrunk")
    assert done.returncode == 0, f"died with {done.returncode}: {done.stderr[-2000:]}"
    assert "DamagedDatasetError" in done.stdout and "shard-00000.safetensors" in done.stdout
    assert (
        "changed on disk while this process read it" in done.stdout
        and "now: inode" in done.stdout
        and "8192 bytes" in done.stdout
    )


def test_a_mapped_shard_rewritten_in_place_is_refused_naming_it(tmp_path):
    done = _run(tmp_path, "rewritten")
    assert done.returncode == 0, f"died with {done.returncode}: {done.stderr[-2000:]}"
    assert "DamagedDatasetError" in done.stdout and "shard-00000.safetensors" in done.stdout
    assert "changed on disk while this process read it" in done.stdout
