"""Online training (train.hidden_states=online): the target runs inside train.py on a token-only
dataset and the head trains exactly as it does offline on the same samples.

Tolerance: the online target computes each batch's states in other forward batches (other
padding) than extraction did. On a CPU whose bf16 matmuls run on avx512_bf16 dot products that
gives bitwise-equal bf16 states for SmolLM2 (measured: every weight equal after training), so
the comparison there allows only fp32 rounding (rtol 1e-5, atol 1e-6, as the offline resume
test). On AMX tiles (and on a GPU) the bf16 kernels depend on the batch's shape: the states
differ by bf16 ulps, Adam turns those into weight differences of the order of the learning
rate over a few steps (measured on an AMX Xeon: at most 7e-3 after 6 steps at lr 2e-3), while
the validation figures stay within 1e-3. There the states are compared directly (bf16
tolerance) and the trained heads by their figures and a bound of a few learning rates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import compose

from eagle3.stages.extract import run as extract
from eagle3.stages.train import run as train
from eagle3.stages.train_inputs import online_target
from eagle3.store import DamagedDatasetError, HiddenStateDataset, Manifest, StoreError, TokenDataset
from eagle3.target_model.compute_dtype import cpu_bf16_on_amx
from eagle3.target_model.records import CaptureError
from eagle3.training.online import OnlineHiddenStates

TINY = ["experiment=tiny_test"]
ONLINE = ["train.hidden_states=online"]
SMOL = [
    "data.max_samples=24",
    "data.max_length=192",
    "data.val_fraction=0.25",
    "head.draft_vocab_size=2048",
    "train.ttt_steps=2",
    "train.max_steps=6",
    "train.warmup_steps=2",
    "train.lr=2e-3",
    "train.max_tokens_per_batch=768",
    "train.val_check_interval=3",
    "logger=none",
    "eval.enabled=false",
    # the online target's states are exact: the stored ones must be too for the same weights
    "capture.storage=exact",
]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return ckpt["state_dict"]


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k, v in wa.items():
        torch.testing.assert_close(wb[k], v, rtol=1e-5, atol=1e-6, msg=k)


def _assert_close_weights(a: Path, b: Path, bound: float) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k, v in wa.items():
        if v.is_floating_point():
            assert float((wb[k].float() - v.float()).abs().max()) <= bound, k
        else:
            assert torch.equal(wb[k], v), k


@pytest.mark.slow
def test_online_trains_the_same_head_as_offline_on_smollm2(tmp_path):
    """Real SmolLM2-135M, real ShareGPT: 6 steps offline (extract.py, then train.py) and 6 steps
    online (train.py alone) end with the same weights and the same validation figures (to the
    tolerance the CPU's bf16 kernels allow: the module doc)."""
    data = [f"paths.datasets_dir={tmp_path / 'data'}"]
    extract(compose("extract", SMOL + data))
    train(compose("train", SMOL + data, output_dir=str(tmp_path / "offline")))
    train(compose("train", SMOL + data + ONLINE, output_dir=str(tmp_path / "online")))
    shape_dependent = cpu_bf16_on_amx()  # bf16 results follow the batch's shape (module doc)
    if shape_dependent:
        _assert_close_weights(tmp_path / "offline", tmp_path / "online", bound=5 * 2e-3)  # 5 x lr
    else:
        _assert_same_weights(tmp_path / "offline", tmp_path / "online")
    off = json.loads((tmp_path / "offline" / "summary.json").read_text())
    on = json.loads((tmp_path / "online" / "summary.json").read_text())
    assert on["hidden_states"] == "online" and off["hidden_states"] == "offline"
    assert on["global_step"] == off["global_step"] == 6
    for key in ("val/loss", "val/acc_k0", "val/replay_accept_len"):
        assert on["final"][key] == pytest.approx(off["final"][key], rel=1e-3 if shape_dependent else 1e-5), key
    # the states themselves: the online target's records against the stored ones, sample by
    # sample (the same token ids; bf16 values within a rounding or two)
    stored = HiddenStateDataset(Path(off["dataset_dir"]))
    items = [{**stored[i], "sample_id": stored.sample_id(i)} for i in range(4)]
    target = OnlineHiddenStates(
        str(Path(off["target_dir"])), [2, 15, 27, 30], 576, torch.bfloat16,
        max_tokens_per_batch=4096, row_tokens=None, fixed_shape=False,
    )  # fmt: skip
    target.setup("cpu")
    try:
        records = list(target.backend.capture((it["sample_id"], it["input_ids"], it["loss_mask"]) for it in items))
    finally:
        target.close()
    for it, rec in zip(items, records):
        assert torch.equal(rec.token_ids, it["input_ids"])
        x, y = rec.hidden.float(), it["hidden"].float()  # [T, L, H]
        rel = ((x - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-6)).mean()
        assert float(rel) < (1e-2 if shape_dependent else 1e-6), (it["sample_id"], float(rel))
    # the online run read a token dataset: no hidden states stored for it
    online_ds = Path(on["dataset_dir"])
    assert online_ds != Path(off["dataset_dir"]) and not list(online_ds.glob("shard-*"))
    record = json.loads((tmp_path / "online" / "dataset_manifest.json").read_text())
    assert record["hidden_states"] == "online" and record["layer_ids"] == [2, 15, 27, 30]
    offline_record = Manifest.read(Path(off["dataset_dir"]))
    assert sorted(record["sample_ids"]) == sorted(offline_record.sample_ids)
    assert record["val_ids"] == sorted(record["val_ids"], key=record["sample_ids"].index)
    assert set(record["val_ids"]) == set(offline_record.val_ids)


def test_online_resume_equals_uninterrupted(tmp_path):
    """8 online steps in one go == 3, then a resume for the rest (the same batch stream as offline)."""
    common = TINY + ONLINE + [f"paths.datasets_dir={tmp_path / 'data'}", "train.lr_decay_steps=8"]
    train(compose("train", common + ["train.max_steps=8"], output_dir=str(tmp_path / "straight")))
    train(compose("train", common + ["train.max_steps=3"], output_dir=str(tmp_path / "split")))
    train(compose("train", common + ["train.max_steps=8"], output_dir=str(tmp_path / "split")))
    _assert_same_weights(tmp_path / "straight", tmp_path / "split")
    a = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert a["global_step"] == 8


def test_the_pre_pass_writes_tokens_only_and_is_reused(tmp_path, capsys):
    """extract.py train.hidden_states=online: token ids, split and vocabulary, no hidden states;
    a second run finds it; a stored-dataset reader refuses it by name; a cut file is caught."""
    cfg = compose("extract", TINY + ONLINE + [f"paths.datasets_dir={tmp_path}"])
    dataset_dir = Path(extract(cfg))
    assert sorted(p.name for p in dataset_dir.iterdir() if not p.name.startswith(".")) == [
        "manifest.json",
        "token_freq.safetensors",
        "tokens.safetensors",
        "vocab-2048.safetensors",
    ]
    m = Manifest.read(dataset_dir)
    assert m.hidden_states == "online" and m.complete and m.layer_ids == [1, 2, 3, 4]
    ds = TokenDataset(dataset_dir)
    assert len(ds) == m.num_samples == 40 and len(ds.val_indices()) == len(m.val_ids) > 0
    item = ds[0]
    assert set(item) == {"input_ids", "loss_mask", "sample_id"} and item["sample_id"] == m.sample_ids[0]
    assert item["input_ids"].dtype == torch.int64 and item["loss_mask"].dtype == torch.bool
    assert int(sum(ds.lengths)) == m.num_tokens
    with pytest.raises(StoreError, match="train it with train.hidden_states=online"):
        HiddenStateDataset(dataset_dir)
    mtime = (dataset_dir / "tokens.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert Path(extract(cfg)) == dataset_dir
    assert (dataset_dir / "tokens.safetensors").stat().st_mtime_ns == mtime
    tokens = dataset_dir / "tokens.safetensors"
    tokens.write_bytes(tokens.read_bytes()[:-100])
    with pytest.raises(DamagedDatasetError, match="tokens.safetensors: size"):
        TokenDataset(dataset_dir)


def _online(target_dir: str, layer_ids, hidden_size: int) -> OnlineHiddenStates:
    return OnlineHiddenStates(
        target_dir, layer_ids, hidden_size, torch.float32, max_tokens_per_batch=512, row_tokens=None, fixed_shape=False
    )


def test_online_records_pass_the_capture_adapter(tmp_path):
    """A wrong hidden size, a layer id out of range, or a layer whose output turns NaN fails
    before any state reaches the head, naming what was expected and the sample."""
    from eagle3.target_model.resolve import resolve_target

    cfg = compose("train", TINY + ONLINE + [f"paths.datasets_dir={tmp_path}"])
    target_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    with pytest.raises(CaptureError, match="hidden size: expected 32"):
        _online(target_dir, [1, 2, 3, 4], 32).setup("cpu")
    with pytest.raises(CaptureError, match="layer_ids: expected unique ascending ids in 0..4"):
        _online(target_dir, [1, 2, 9], 64).setup("cpu")
    online = _online(target_dir, [1, 2, 3, 4], 64)
    online.setup("cpu")
    ids = torch.arange(5, 25)
    item = {"sample_id": "s0", "input_ids": ids, "loss_mask": torch.ones(20, dtype=torch.bool)}
    batch = online([item])
    assert batch["aux_hidden"].shape == (1, 20, 3 * 64) and batch["final_hidden"].shape == (1, 20, 64)

    # a hook ahead of the capture's that turns the last layer's output to NaN
    def poison(module, args, out):
        return out * float("nan") if isinstance(out, torch.Tensor) else (out[0] * float("nan"), *out[1:])

    online.backend.model.layers[-1].register_forward_hook(poison, prepend=True)
    with pytest.raises(CaptureError, match=r"sample 's0': hidden: expected finite values, got 1280 NaN"):
        online([item])


def test_online_refuses_a_sharded_target(tmp_path):
    cfg = compose("train", TINY + ONLINE + [f"paths.datasets_dir={tmp_path}", "topology.strategy=fsdp"])
    with pytest.raises(ValueError, match="expected topology.strategy auto or ddp"):
        online_target(cfg, "unused", False, None, [1, 2, 3, 4])


def _torchrun_train(args: list[str], run_dir: Path) -> None:
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    out = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", "train.py", *args, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow
def test_online_ddp_equals_offline_ddp(tmp_path):
    """2 ranks on CPU (gloo), each with its own copy of the target: the same weights as 2 ranks
    reading the stored dataset. Both ranks start without the token dataset: one writes it, the
    other waits for it (the pre-pass lock)."""
    common = TINY + ["topology=cpu_ddp2", f"paths.datasets_dir={tmp_path / 'data'}", "train.max_steps=4"]
    extract(compose("extract", TINY + [f"paths.datasets_dir={tmp_path / 'data'}"]))
    _torchrun_train(common, tmp_path / "offline")
    _torchrun_train(common + ONLINE, tmp_path / "online")
    _assert_same_weights(tmp_path / "offline", tmp_path / "online")
    assert len(list((tmp_path / "data").glob("*-tokens-*"))) == 1


def test_a_token_dataset_of_other_layers_is_refused_naming_both(tmp_path):
    """dataset_dir= of a token dataset captured at layers [2, 3] + 4 under a config whose layers
    are [1, 2, 3] + 4: refused naming both (a head trained on one set would be exported as
    reading the other); the online target captures the layer ids it is given (the dataset's)."""
    from eagle3.stages.train_inputs import find_token_dataset
    from eagle3.target_model.resolve import resolve_target

    dataset_dir = Path(
        extract(compose("extract", TINY + ONLINE + [f"paths.datasets_dir={tmp_path}", "layers.aux_ids=[2,3]"]))
    )
    assert Manifest.read(dataset_dir).layer_ids == [2, 3, 4]
    cfg = compose("train", TINY + ONLINE + [f"paths.datasets_dir={tmp_path}", f"dataset_dir={dataset_dir}"])
    target_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    with pytest.raises(
        ValueError,
        match=r"manifest.json: layer_ids, hidden_size: expected \[1, 2, 3, 4\], 64, got \[2, 3, 4\], 64",
    ):
        find_token_dataset(cfg, target_dir)
    same = compose(
        "train",
        TINY + ONLINE + [f"paths.datasets_dir={tmp_path}", f"dataset_dir={dataset_dir}", "layers.aux_ids=[2,3]"],
    )
    assert find_token_dataset(same, target_dir) == dataset_dir
    assert online_target(same, target_dir, False, None, [2, 3, 4]).layer_ids == [2, 3, 4]
