"""The native capture route's reader on files vLLM's ExampleHiddenStatesConnector really wrote
(CUDA vLLM 0.26.0 on an H200, SmolLM2-135M, capture ids [2, 15, 27, 30]; tests/assets/vllm_native/
README.md has the command). CI has no GPU: these files are the route's ground truth here.

Each real file passes the adapter, holds the states the HF backend computes on this CPU, and
every way a file can be wrong is refused naming the field: one layer where four were asked
(the seed's failure class), another request's states, rows missing, a file still being written.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3.target.adapter import CaptureError, CaptureSpec
from eagle3.target.capture_vllm import _wait_whole, read_native_file

ASSETS = Path(__file__).parent / "assets" / "vllm_native"
FILES = sorted(ASSETS.glob("*.safetensors"))
IDS = (2, 15, 27, 30)
HIDDEN = 576
HF_MIN_COSINE = 0.99  # bf16 on an H200 (vLLM kernels) against bf16 on this CPU (transformers)


def _read(path: Path, **over):
    data = load_file(str(path))
    side = json.loads(path.with_suffix(".json").read_text())
    ids = over.get("input_ids", data["token_ids"])
    spec = CaptureSpec(IDS, HIDDEN, torch.bfloat16, int(ids.shape[0]))
    mask = torch.tensor(side["loss_mask"], dtype=torch.bool)
    return read_native_file(str(path), spec=spec, input_ids=ids, loss_mask=mask, sample_id=side["sample_id"])


def _rewrite(src: Path, dst: Path, **tensors) -> Path:
    data = load_file(str(src))
    data.update(tensors)
    save_file({k: v.contiguous() for k, v in data.items()}, str(dst))
    shutil.copy(src.with_suffix(".json"), dst.with_suffix(".json"))
    return dst


def test_the_real_files_are_there():
    assert len(FILES) >= 2, f"expected connector files in {ASSETS}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_a_real_file_passes_the_adapter(path):
    rec = _read(path)
    T = int(load_file(str(path))["token_ids"].shape[0])
    assert rec.hidden.shape == (T, len(IDS), HIDDEN) and rec.hidden.dtype == torch.bfloat16
    assert rec.token_ids.tolist() == load_file(str(path))["token_ids"].tolist()


@pytest.mark.slow
def test_the_files_hold_the_states_transformers_computes(smollm2_dir):
    """Per layer, mean cosine over tokens against the HF backend on this CPU (id 30 included:
    vLLM's final id is the state before the final norm, as our HF backend captures it)."""
    from eagle3.target.capture_hf import HFCaptureBackend

    feed = []
    for path in FILES:
        ids = load_file(str(path))["token_ids"]
        feed.append((path.stem, ids, torch.ones_like(ids, dtype=torch.bool)))
    with HFCaptureBackend(str(smollm2_dir), IDS) as hf:
        ref = dict(hf.capture_with_ids(feed))
    for path in FILES:
        got = _read(path).hidden.float()
        cos = torch.nn.functional.cosine_similarity(got, ref[path.stem].hidden.float(), dim=-1)  # [T, L]
        for j, lid in enumerate(IDS):
            assert float(cos[:, j].mean()) >= HF_MIN_COSINE, (path.name, lid, float(cos[:, j].mean()))
        # and a neighbouring layer is far: the ids are not off by one
        wrong = torch.nn.functional.cosine_similarity(got[:, 1], ref[path.stem].hidden.float()[:, 2], dim=-1)
        assert float(wrong.mean()) < float(cos[:, 1].mean()) - 0.05


def test_one_layer_where_four_were_asked_is_refused(tmp_path):
    src = FILES[0]
    bad = _rewrite(src, tmp_path / "one.safetensors", hidden_states=load_file(str(src))["hidden_states"][:, :1])
    with pytest.raises(CaptureError, match=r"hidden: expected .*4.*576.*got tensor\[\d+, 1, 576\]"):
        _read(bad)


def test_another_requests_states_are_refused(tmp_path):
    a, b = FILES[0], FILES[1]
    swapped = _rewrite(a, tmp_path / "swapped.safetensors", **load_file(str(b)))  # b's file, a's sidecar
    with pytest.raises(CaptureError, match="returned_token_ids"):
        _read(swapped, input_ids=load_file(str(a))["token_ids"])


def test_missing_rows_are_refused(tmp_path):
    src = FILES[0]
    short = _rewrite(src, tmp_path / "short.safetensors", hidden_states=load_file(str(src))["hidden_states"][:-3])
    with pytest.raises(CaptureError, match="hidden"):
        _read(short)


def test_a_file_without_its_tensors_is_refused(tmp_path):
    src = FILES[0]
    data = load_file(str(src))
    save_file({"token_ids": data["token_ids"]}, str(tmp_path / "x.safetensors"))
    shutil.copy(src.with_suffix(".json"), tmp_path / "x.json")
    with pytest.raises(CaptureError, match=r"tensors: expected \['hidden_states', 'token_ids'\]"):
        _read(tmp_path / "x.safetensors")


def test_a_file_still_being_written_is_waited_for_then_refused(tmp_path):
    """The connector holds <file>.lock exclusively until the write ends: the reader waits,
    and names the file when the lock outlives the deadline."""
    path = tmp_path / "req.safetensors"
    shutil.copy(FILES[0], path)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(CaptureError, match="still locked after"):
            _wait_whole(str(path), "s0", timeout_s=0.3)
    _wait_whole(str(path), "s0", timeout_s=0.3)  # released: returns at once
