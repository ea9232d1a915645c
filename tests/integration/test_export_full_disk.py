"""`python export.py`'s stage in a subprocess on a 64 KiB tmpfs (a user and mount namespace,
`unshare -rm`: a real full disk): the error names the directory, the bytes and the free space, and
the previous export stays whole. Skipped where namespaces are off."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from helpers import tiny_head_checkpoint

import eagle3

_SMALL_DISK = """
import sys
from eagle3.config.cli import ExportCliConfig
from eagle3.stages.export import run
try:
    run(ExportCliConfig(ckpt=sys.argv[1], out=sys.argv[2]))
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(3)
"""


def test_a_full_disk_during_export_names_the_directory_the_bytes_and_the_free_space(tmp_path):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("needs unprivileged user and mount namespaces (unshare -rm) for a small tmpfs")
    disk, ckpt_a, ckpt_b = (
        tmp_path / "disk",
        tiny_head_checkpoint(tmp_path / "a.ckpt", 0),
        tiny_head_checkpoint(tmp_path / "b.ckpt", 1),
    )
    disk.mkdir()
    out = disk / "export"
    script = tmp_path / "export_on_small_disk.py"
    script.write_text(_SMALL_DISK)
    # room for one export (its weights 32 KiB, a card: 48 KiB in pages) and not for the next one's
    # weights beside it, as the swap needs
    mount = f"mount -t tmpfs -o size=64k tmpfs {disk}"
    first, second = (f"{sys.executable} {script} {ckpt} {out}" for ckpt in (ckpt_a, ckpt_b))
    sums = f"sha256sum {out}/*"
    shell = f"{mount} && {first} && {sums} && echo === && {second}; echo rc=$? && {sums} && echo === && ls -A {disk}"
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", shell],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(Path(eagle3.__file__).parents[1])},  # this test's eagle3
        timeout=300,
    )
    assert "===" in proc.stdout and "rc=3" in proc.stdout, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"DiskSpaceError: {out}: disk full writing the export: needs "), err
    assert " bytes) for model.safetensors" in err and " free there" in err and "the previous export is whole" in err
    before, after, listing = proc.stdout.split("===")
    after = after.split("rc=3", 1)[1]
    assert _sums(after) == _sums(before)  # the previous export whole, byte for byte
    assert listing.split() == ["export"]  # nothing half-written beside it


def _sums(text: str) -> dict[str, str]:
    """sha256sum's lines: file -> hash."""
    return {line.split()[1]: line.split()[0] for line in text.splitlines() if len(line.split()) == 2 and "/" in line}
