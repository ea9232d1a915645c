"""The real entrypoints compose as the tests of conf/ do: `--cfg job --resolve` prints the sizes and
why, and a typo exits non-zero naming the key."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT
from omegaconf import OmegaConf


def test_cfg_job_prints_the_sizes_and_why():
    """The real entrypoint: a GPU topology on the command line brings the GPU sizes, says so on
    stderr, and --cfg job names both."""
    out = subprocess.run(
        [sys.executable, "train.py", "topology=gpu1", "--cfg", "job", "--resolve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "\nsizes: gpu\n" in out.stdout and "\nsizes_source: topology.accelerator=gpu\n" in out.stdout
    assert "sizes=gpu: topology=gpu1 runs on a GPU" in out.stderr


@pytest.mark.parametrize("entry", ["train.py", "extract.py"])
def test_cli_cfg_job_resolve(entry):
    out = subprocess.run(
        [sys.executable, entry, "model=kimi_k2_5", "topology=gpu8_tp8", "capture=vllm", "--cfg", "job", "--resolve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    resolved = OmegaConf.create(out.stdout)
    assert list(resolved.layers.layer_ids) == [2, 30, 58, 61]
    assert resolved.topology.extract_tp == 8
    assert resolved.capture.vllm_route == "native"  # the 8-GPU config names vLLM's own connector


def test_cli_typo_exits_nonzero_with_key():
    out = subprocess.run(
        [sys.executable, "train.py", "train.lrr=1"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    assert "lrr" in out.stderr
