"""2-process DDP on CPU (gloo), ranks started by torchrun: one shared run dir, different
data per rank, validation counts summed exactly (= a 1-process validation of the same
checkpoint); and a multi-device topology refused unless torchrun/srun started the ranks."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose
from helpers.trainers import quiet_cpu_trainer
from omegaconf import OmegaConf

from eagle3.stages.train import run as train
from eagle3.store.batch_options import BatchShape
from eagle3.util.launch import LaunchError, check_external_launch, launch_run_id

TINY = ["experiment=tiny_test"]
STEPS = 3

PROBE = Path(__file__).with_name("ddp_probe.py")  # train.py plus a probe, run under torchrun


@pytest.fixture(scope="module")
def ddp_run(datasets_dir, tmp_path_factory) -> Path:
    """torchrun --standalone --nproc_per_node 2 (train.py + a probe recording each rank's batches)."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    logs = tmp_path_factory.mktemp("logs")
    out = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node",
            "2",
            str(PROBE),
            *TINY,
            "topology=cpu_ddp2",
            f"paths.datasets_dir={datasets_dir}",
            f"paths.log_dir={logs}",
            f"train.max_steps={STEPS}",
            f"train.val_check_interval={STEPS}",
            "logger=wandb",
            "logger.mode=offline",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    # val metrics are reduced as counts by us: Lightning's sync_dist advice is filtered, not printed
    assert "It is recommended to use `self.log('val" not in out.stdout + out.stderr
    run_dirs = list((logs / "train" / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs  # both ranks wrote one run dir
    return run_dirs[0]


def _fingerprint(ids: torch.Tensor) -> str:  # as ddp_probe.py does
    return hashlib.sha1(ids.numpy().tobytes()).hexdigest()[:16]


def _probes(run_dir: Path) -> list[dict]:
    return [json.loads((run_dir / f"probe-rank{r}.json").read_text()) for r in (0, 1)]


def test_ranks_share_one_run_dir_named_by_torchrun(ddp_run):
    assert ddp_run.name.startswith("torchrun-")  # TORCHELASTIC_RUN_ID, not two clocks
    probes = _probes(ddp_run)
    assert [p["rank"] for p in probes] == [0, 1]
    assert all(p["world_size"] == 2 and p["strategy"] == "DDPStrategy" and p["backend"] == "gloo" for p in probes)
    summary = json.loads((ddp_run / "summary.json").read_text())
    assert summary["global_step"] == STEPS
    assert len(list((ddp_run / "wandb").glob("offline-run-*"))) == 1  # rank 0 logs, rank 1 does not


def test_ranks_train_on_different_data(ddp_run):
    r0, r1 = (p["train"] for p in _probes(ddp_run))
    assert len(r0) == len(r1) == STEPS  # equal batch counts: no rank waits on the other
    seen0, seen1 = {s for b in r0 for s in b}, {s for b in r1 for s in b}
    assert seen0 and seen1 and not seen0 & seen1  # within one pass, no sample on both ranks


def test_validation_covers_every_val_sample_once(ddp_run, datasets_dir):
    from eagle3.store import HiddenStateDataset

    ds = HiddenStateDataset(json.loads((ddp_run / "summary.json").read_text())["dataset_dir"])
    max_tokens = OmegaConf.load(ddp_run / ".hydra" / "config.yaml").train.max_tokens_per_batch
    want = Counter(_fingerprint(ds[i]["input_ids"][:max_tokens]) for i in ds.val_indices())
    v0, v1 = (p["val"] for p in _probes(ddp_run))
    assert len(v0) == len(v1) == 1  # one validation inside fit (at step 3)
    got = Counter(s for rank in (v0[0], v1[0]) for batch in rank for s in batch)
    assert got == want  # nothing dropped to even out ranks, nothing counted twice


def test_val_metrics_equal_one_process_validation(ddp_run, datasets_dir):
    """The DDP run's val metrics are sums of counts over ranks: a single process validating
    the same checkpoint on the same val set must get the same numbers."""
    from eagle3.target_model.resolve import resolve_target
    from eagle3.training.builder import build_head
    from eagle3.training.datamodule import Eagle3DataModule
    from eagle3.training.module import Eagle3LitModule
    from eagle3.training.step_path import resolve_step_path

    summary = json.loads((ddp_run / "summary.json").read_text())
    cfg = compose("train", TINY + [f"paths.datasets_dir={datasets_dir}"])
    dm = Eagle3DataModule(summary["dataset_dir"], shape=BatchShape(int(cfg.train.max_tokens_per_batch)))
    path = resolve_step_path(cfg.train, cfg.topology)  # the path the DDP run trained and validated on
    target_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    head, meta = build_head(
        cfg.head,
        cfg.train,
        cfg.model,
        target_dir,
        dm.dataset,
        attention=path.attention,
        target=target_dir,
        num_speculative_tokens=cfg.eval.num_draft_tokens,
    )
    module = Eagle3LitModule(head, OmegaConf.to_object(cfg.train))
    state = torch.load(ddp_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    missing, unexpected = module.load_state_dict(state, strict=False)
    frozen = {k for k, p in module.named_parameters() if not p.requires_grad}
    assert not unexpected and set(missing) <= frozen  # every trained weight came from the DDP run
    trainer = quiet_cpu_trainer(
        devices=1,
        precision=path.precision,
    )
    single = trainer.validate(module, datamodule=dm, verbose=False)[0]
    ddp = summary["final"]
    assert ddp["val/tokens"] == single["val/tokens"] > 0  # both ranks' tokens, summed
    # the replay's rounds are counts too: summed over ranks, they equal one process's
    for key in (
        "val/loss",
        "val/loss_k0",
        "val/loss_k1",
        "val/acc_k0",
        "val/sim_accept_len",
        "val/replay_accept_len",
        "val/replay_rounds",
        "val/replay_acc_pos0",
    ):
        assert ddp[key] == pytest.approx(single[key], rel=1e-5, abs=1e-7), key


def test_multi_device_topology_needs_an_external_launcher(tmp_path):
    with pytest.raises(LaunchError, match="torchrun --standalone --nproc_per_node 2"):
        train(
            compose("train", TINY + ["topology=cpu_ddp2", f"paths.datasets_dir={tmp_path}"], output_dir=str(tmp_path))
        )


def test_launch_checks_and_run_ids():
    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    srun = {
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "3",
        "SLURM_JOB_ID": "812",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS_PER_NODE": "8",
    }
    check_external_launch(2, 1, torchrun)
    check_external_launch(8, 2, srun)
    check_external_launch(1, 1, {})
    with pytest.raises(LaunchError, match="torchrun started 2"):
        check_external_launch(4, 1, torchrun)
    with pytest.raises(LaunchError, match="single process"):
        check_external_launch(8, 1, {})
    # every rank of one launch agrees on the run dir name; a single process gets the time
    assert launch_run_id(torchrun) == "torchrun-abc"
    assert launch_run_id(srun) == "slurm-812.0"
    assert launch_run_id({**torchrun, "EAGLE3_RUN_ID": "mine"}) == "mine"
    assert launch_run_id({}, now=datetime(2025, 1, 2, 3, 4, 5)) == "2025-01-02_03-04-05"
    with pytest.raises(LaunchError, match="--standalone"):  # torchrun's default rdzv id is "none"
        launch_run_id({**torchrun, "TORCHELASTIC_RUN_ID": "none"})
