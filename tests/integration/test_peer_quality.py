"""bench/peer_train.py and bench/peer_quality.py on a real extracted dataset (tiny random Llama
target, real ShareGPT samples): speculators 0.9's draft trains on our store, its loss falls,
a time budget ends at the schedule floor, the export loads in speculators and in eagle3's
loader, and the replay adapter gives speculators' model eagle3's head interface exactly."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose
from safetensors.torch import load_file

pytest.importorskip("speculators")
sys.path.insert(0, str(ROOT / "bench"))

import peer_quality  # noqa: E402
import peer_train  # noqa: E402

TINY = ["experiment=tiny_test"]
SMOKE = ["--seq-len", "512", "--draft-vocab", "2048", "--log-every", "1000", "--device", "cpu"]


@pytest.fixture(scope="module")
def dataset_dir(datasets_dir) -> Path:
    (found,) = datasets_dir.glob("*/manifest.json")
    return found.parent


def _train(dataset_dir: Path, out: Path, *extra: str) -> dict:
    return peer_train.main(
        ["--dataset-dir", str(dataset_dir), "--out", str(out), "--cache-dir", str(ROOT / ".cache"), *SMOKE, *extra]
    )


@pytest.mark.slow
def test_a_budgeted_peer_run_learns_ends_at_the_floor_and_exports(dataset_dir, tmp_path):
    lr, floor = 1e-3, 0.05
    doc = _train(dataset_dir, tmp_path, "--minutes", "0.4", "--min-lr-ratio", str(floor))
    assert json.loads((tmp_path / "peer_train.json").read_text())["global_step"] == doc["global_step"]
    lrs = doc["lrs"]
    # ~0.1 s a step here when the machine is idle; a busy one gives far fewer
    assert doc["global_step"] == len(lrs) > 8, f"too few steps in 24 s to test the schedule: {len(lrs)}"
    assert doc["elapsed_s"] >= 24.0 and doc["tokens"] > 0
    assert doc["loss_last"] < doc["loss_first"]
    # the budget ran out at the floor: never below it, and the last step starts at most two of the
    # fitted step times before the clock's end (a busy machine stretches one), so its lr is the
    # cosine's at that point at most
    assert min(lrs[lrs.index(max(lrs)) :]) >= lr * floor * (1 - 1e-6)  # after the warm-up
    early = min(1.0, 2 * doc["step_time_s"] / doc["elapsed_s"])
    assert lrs[-1] <= lr * (floor + (1 - floor) * (1 + math.cos(math.pi * (1 - early))) / 2) * (1 + 1e-6)
    assert max(lrs) == pytest.approx(lr, rel=1e-6) and doc["schedule_progress"] == 1.0
    assert doc["recipe"]["ttt_steps"] == 3 and doc["recipe"]["optimizer"] == "adamw"
    assert doc["recipe"]["norm_output"] and doc["recipe"]["norm_before_residual"] and doc["recipe"]["norm_before_fc"]
    assert doc["loss_impl"] == "eager"

    export = tmp_path / "export"
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 2048
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and cfg["norm_output"] is True
    assert cfg["transformer_layer_config"]["intermediate_size"] == 128  # the target's (tiny_llama)
    saved = load_file(str(export / "model.safetensors"))
    assert saved["fc.weight"].dtype == torch.bfloat16 and "embed_tokens.weight" not in saved
    assert int(saved["t2d"].sum()) == 2048

    # speculators reads it back: the trained weights, frozen parts from the target
    model = peer_train.load_peer_export(export, doc["verifier"])
    for name, tensor in saved.items():
        assert torch.equal(model.state_dict()[name].to(tensor.dtype), tensor), name
    assert not torch.isnan(model.embed_tokens.weight).any()
    # and eagle3's loader takes the same file (names and shapes of our export format)
    from eagle3.evaluation.diagnostics.head_replay import load_exported_head

    head, aux_layer_ids = load_exported_head(export, doc["verifier"])
    assert aux_layer_ids == [1, 2, 3] and torch.equal(head.fc.weight, saved["fc.weight"].float())
    # eagle3's head has no sliding-window attention: the peer is replayed by speculators' model
    assert "sliding_window" in peer_quality.eagle3_lacks(cfg)


def test_speculators_head_gives_eagle3_head_logits_and_the_same_replay(dataset_dir, tmp_path):
    """A peer without the EAGLE-3.1 residual/output norms is a plain EAGLE-3 head (+ input norm):
    eagle3's head and speculators' model behind SpeculatorsHead give the same step logits at
    every counted position, and the same replay."""
    from eagle3.draft.shift import shift_left
    from eagle3.evaluation.diagnostics.head_replay import load_exported_head
    from eagle3.store.batch_options import BatchShape
    from eagle3.training.datamodule import Eagle3DataModule

    doc = _train(dataset_dir, tmp_path, "--max-steps", "4", "--no-norm-before-residual", "--no-norm-output")
    export = tmp_path / "export"
    ours, _ = load_exported_head(export, doc["verifier"])
    theirs = peer_quality.SpeculatorsHead(peer_train.load_peer_export(export, doc["verifier"]))
    dm = Eagle3DataModule(str(dataset_dir), shape=BatchShape(1024), require_train=False)
    batch = next(iter(dm.loader_for(dm.val_idx)))
    args = (batch["aux_hidden"], batch["input_ids"], batch["position_ids"], batch["segment_ids"], 3)
    with torch.no_grad():
        a, b = ours(*args), theirs(*args)
        torch.testing.assert_close(
            theirs.target_logits(batch["final_hidden"]), ours.target_logits(batch["final_hidden"]), rtol=1e-5, atol=1e-5
        )
    assert batch["segment_ids"].max() > 0  # several samples packed in the row
    for k in range(3):
        _, valid = shift_left(batch["input_ids"], batch["segment_ids"], 1 + k)  # x_{t+1+k} in t's sample
        torch.testing.assert_close(a[k][valid], b[k][valid], rtol=1e-4, atol=1e-4)
    common = dict(num_draft_tokens=3, max_answer_tokens=128, device="cpu")
    mine = peer_quality.replay(export, str(dataset_dir), target=doc["verifier"], impl="eagle3", **common)
    spec = peer_quality.replay(export, str(dataset_dir), target=doc["verifier"], impl="speculators", **common)
    assert mine["replay_rounds"] == spec["replay_rounds"] > 0
    assert mine["replay_accept_len"] == pytest.approx(spec["replay_accept_len"], abs=1e-9)


def test_tokens_of_a_train_run_are_those_its_batches_held(dataset_dir, tmp_path):
    """`peer_quality.py tokens` recounts a train.py run from its saved config and step count: the
    same total as the real tokens of every batch the run trained on (across a pass boundary)."""
    import lightning as L
    from omegaconf import OmegaConf

    from eagle3.stages.train import run as train

    class Count(L.Callback):
        tokens = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            Count.tokens += int((batch["segment_ids"] >= 0).sum())

    # 8 batches a pass on this dataset: 12 steps run into the second pass
    cfg = compose(
        "train",
        TINY + [f"paths.datasets_dir={dataset_dir.parent}", "train.max_steps=12", "train.val_check_interval=100"],
        output_dir=str(tmp_path),
    )
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")  # what Hydra saves in a run dir
    train(cfg, extra_callbacks=[Count()])
    got = peer_quality.ours_tokens(tmp_path)
    assert got["global_step"] == 12 and got["tokens"] == Count.tokens > 0
