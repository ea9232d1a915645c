"""extract.py end to end (tiny random Llama, real ShareGPT): a run killed mid-way resumes
and gives the same dataset as an uninterrupted one; a finished dataset is a no-op."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import ROOT

from eagle3.store import HiddenStateDataset

ARGS = ["experiment=tiny_test", "capture.shard_max_tokens=512", "capture.batch_size=2"]


def _extract(datasets_dir: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "extract.py", *ARGS, f"paths.datasets_dir={datasets_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _by_id(ds: HiddenStateDataset) -> dict[str, dict]:
    return {ds.sample_id(i): ds[i] for i in range(len(ds))}


def test_killed_extraction_resumes_to_the_same_dataset(tmp_path):
    straight = _extract(tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    ref_dir = Path(straight.stdout.strip().splitlines()[-1])

    killed_root = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "extract.py", *ARGS, f"paths.datasets_dir={killed_root}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(killed_root.glob("*/shard-*.safetensors"))) >= 2:
            os.killpg(proc.pid, signal.SIGKILL)  # mid-way: some shards durable, the rest not
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    (part_dir,) = list(killed_root.iterdir())
    assert '"complete": false' in (part_dir / "manifest.json").read_text()

    resumed = _extract(killed_root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    done = re.search(r"\((\d+) already done\)", resumed.stderr)
    assert done and int(done.group(1)) > 0, resumed.stderr[-2000:]  # the shards durable before the kill count
    got_dir = Path(resumed.stdout.strip().splitlines()[-1])
    assert got_dir.name == ref_dir.name  # same fingerprint from the same config

    ref, got = HiddenStateDataset(ref_dir, verify="full"), HiddenStateDataset(got_dir, verify="full")
    assert (got.manifest.num_samples, got.manifest.num_tokens, got.manifest.num_loss_tokens) == (
        ref.manifest.num_samples,
        ref.manifest.num_tokens,
        ref.manifest.num_loss_tokens,
    )
    assert sorted(got.manifest.val_ids) == sorted(ref.manifest.val_ids)
    assert torch.equal(got.token_freq(), ref.token_freq())
    a, b = _by_id(ref), _by_id(got)
    assert a.keys() == b.keys()
    for sid in a:
        assert torch.equal(a[sid]["input_ids"], b[sid]["input_ids"]), sid
        assert torch.equal(a[sid]["loss_mask"], b[sid]["loss_mask"]), sid
        torch.testing.assert_close(b[sid]["hidden"].float(), a[sid]["hidden"].float(), rtol=2e-2, atol=2e-2)

    again = _extract(killed_root)
    assert again.returncode == 0
    assert "already complete" in again.stderr and "nothing to do" in again.stderr
    assert again.stdout.strip().splitlines()[-1] == str(got_dir)
