"""Both entrypoints print the cost estimate before any work and write it to the run log (extract.py
and train.py in a subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from helpers.printed import printed_number


def _run(entry: str, args: list[str], run_dir: Path) -> str:
    out = subprocess.run(
        [sys.executable, entry, "experiment=tiny_test", *args, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_both_stages_print_the_estimate_and_write_it_to_the_run_log(tmp_path):
    data = [f"paths.datasets_dir={tmp_path / 'data'}"]
    stdout = _run("extract.py", data, tmp_path / "extract")
    line = "extract: 40 samples x <= 128 tokens = <= 5,120 tokens"
    assert line in stdout and line in (tmp_path / "extract" / "extract.log").read_text()
    rendered = re.search(r"extract: ([\d,]+) tokens to capture \(rendered\)", stdout)
    assert rendered and 0 < printed_number(rendered.group(1)) <= 5120

    stdout = _run("train.py", data + ["train.max_steps=2", "train.val_check_interval=2"], tmp_path / "train")
    line = "train: 2 steps x <= 512 tokens = <= 1,024 tokens"
    assert line in stdout and line in (tmp_path / "train" / "train.log").read_text()
