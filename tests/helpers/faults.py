"""What the fault tests share: the tiny config, the real entrypoints in a subprocess (with a
fault injected through EAGLE3_FAULT), and comparisons of two datasets or directories."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch
from conftest import ROOT

from eagle3.store import HiddenStateDataset
from eagle3.util.faults import ENV

# one sample per forward: a sample's hidden states do not depend on what it was batched with,
# so a resumed or repaired dataset can be compared byte for byte
ARGS = ["experiment=tiny_test", "capture.shard_max_tokens=512", "capture.batch_size=1"]


def cli(argv: list[str], fault: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python <argv>`` from the repo root, with ``EAGLE3_FAULT=fault`` (or none)."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if fault:
        env[ENV] = fault
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def assert_killed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == -signal.SIGKILL, (
        f"expected death by SIGKILL at the fault point, got exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    )


def temps(directory: Path) -> list[str]:
    return sorted(p.name for p in Path(directory).rglob("*") if ".tmp-" in p.name)


def file_bytes(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (lock files left out) by relative path."""
    directory = Path(directory)
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def copy_dataset(dataset: Path, datasets_dir: Path) -> Path:
    """``dataset`` copied into ``datasets_dir`` under its own name (its name is its fingerprint:
    an extraction of the same config there finds the copy)."""
    copy = Path(datasets_dir) / Path(dataset).name
    shutil.copytree(dataset, copy)
    return copy


def assert_same_dataset(got_dir: Path, want_dir: Path) -> None:
    """Same samples (ids, tokens, masks, hidden states: exactly), split, counts and vocabularies;
    the shard files may group the samples differently (a resumed run flushes at other points)."""
    got, want = HiddenStateDataset(got_dir, verify="full"), HiddenStateDataset(want_dir, verify="full")
    g, w = got.manifest, want.manifest
    assert (g.num_samples, g.num_tokens, g.num_loss_tokens) == (w.num_samples, w.num_tokens, w.num_loss_tokens)
    assert sorted(g.sample_ids) == sorted(w.sample_ids) and g.val_ids == w.val_ids
    assert torch.equal(got.token_freq(), want.token_freq()) and got.vocab_sizes == want.vocab_sizes
    for V in want.vocab_sizes:
        assert all(torch.equal(a, b) for a, b in zip(got.load_vocab(V), want.load_vocab(V)))
    index = {sid: i for i, sid in enumerate(got.sample_ids)}
    for i, sid in enumerate(want.sample_ids):
        a, b = want[i], got[index[sid]]
        for key in ("input_ids", "loss_mask", "hidden"):
            assert torch.equal(a[key], b[key]), f"sample {sid}: {key} differs"
