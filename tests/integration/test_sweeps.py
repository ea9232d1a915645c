"""Multirun sweeps through train.py (a subprocess, as users run it) on the tiny model:
one run dir and one W&B run per job, the sweep's results table, Optuna over the
simulated acceptance length, and submitit's local launcher (jobs in their own processes)."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from omegaconf import OmegaConf

from eagle3.stages.sweep import RESULTS_CSV, RESULTS_MD

TINY = ["experiment=tiny_test", "train.max_steps=2", "train.val_check_interval=2"]
METRIC = "val/replay_accept_len"  # the default optimized_metric


def _train_multirun(datasets_dir: Path, sweep_dir: Path, args: list[str], multirun: bool = True):
    cmd = [
        sys.executable,
        "train.py",
        *(["-m"] if multirun else []),
        *TINY,
        f"paths.datasets_dir={datasets_dir}",
        f"paths.log_dir={sweep_dir.parent / 'logs'}",
        f"hydra.sweep.dir={sweep_dir}",
        *args,
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def _table(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / RESULTS_CSV) as f:
        return list(csv.DictReader(f))


def _job_cfg(job_dir: Path):
    return OmegaConf.load(job_dir / ".hydra" / "config.yaml")


def test_grid_sweep_runs_dirs_wandb_and_table(datasets_dir, tmp_path):
    from helpers.wandb_offline import read_run

    sweep = tmp_path / "sweep-grid"
    out = _train_multirun(
        datasets_dir, sweep, ["train.lr=1e-4,3e-4", "train.ttt_steps=2,3", "logger=wandb", "logger.mode=offline"]
    )
    assert out.returncode == 0, out.stderr[-5000:]
    jobs = sorted((p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    grid = {(float(cfg.train.lr), int(cfg.train.ttt_steps)) for cfg in map(_job_cfg, jobs)}
    assert grid == set(itertools.product([1e-4, 3e-4], [2, 3]))  # each job got its own overrides

    rows = {r["job"]: r for r in _table(sweep)}
    assert set(rows) == {"0", "1", "2", "3"}
    run_ids = set()
    for job in jobs:
        cfg, summary, row = _job_cfg(job), json.loads((job / "summary.json").read_text()), rows[job.name]
        assert summary["global_step"] == 2 and Path(summary["export_dir"]).parent == job  # own run dir
        assert row["status"] == "COMPLETED"
        assert (float(row["train.lr"]), int(row["train.ttt_steps"])) == (float(cfg.train.lr), int(cfg.train.ttt_steps))
        assert float(row[METRIC]) == pytest.approx(summary["final"][METRIC])
        assert float(row["val/loss"]) == pytest.approx(summary["final"]["val/loss"])
        # a ttt_steps=3 job reports a third step, a ttt_steps=2 job does not
        assert (row["val/acc_k2"] != "") == (cfg.train.ttt_steps == 3)
        # main() returned the metric Hydra's sweepers optimise
        status = json.loads((job / "job_status.json").read_text())
        assert status["return_value"] == pytest.approx(summary["final"][METRIC])
        # the serve command and the export path reach the job's log file, not only the console
        log = (job / "train.log").read_text()
        assert "serve it: vllm serve" in log and summary["export_dir"] in log
        (wandb_dir,) = list((job / "wandb").glob("offline-run-*"))  # one W&B run per job, in its dir
        run = read_run(wandb_dir)
        assert run["group"] == sweep.name  # grouped by the sweep
        assert {"model:tiny_llama", "experiment:tiny_test", "topology:cpu"} <= set(run["tags"])
        assert run["config"]["train"]["ttt_steps"] == cfg.train.ttt_steps
        # what ran, not auto/null (the step path settled on this CPU)
        assert (run["config"]["train"]["attention"], run["config"]["train"]["compile"]) == ("sdpa", False)
        assert run["config"]["topology"]["precision"] in ("bf16-mixed", "32-true")
        run_ids.add(wandb_dir.name)
    assert len(run_ids) == 4
    md = (sweep / RESULTS_MD).read_text()
    assert md.count("| COMPLETED |") == 4 and "**best**" in md and f"`{METRIC}`" in md


def test_optuna_maximises_the_replayed_acceptance(datasets_dir, tmp_path):
    sweep = tmp_path / "sweep-optuna"
    out = _train_multirun(
        datasets_dir, sweep, ["hparams_search=optuna", "hydra.sweeper.n_trials=3", "logger=none"], multirun=False
    )  # the preset sets hydra.mode=MULTIRUN itself
    assert out.returncode == 0, out.stderr[-5000:]
    result = OmegaConf.load(sweep / "optimization_results.yaml")
    params = ["train.lr", "train.ttt_steps", "train.step_decay", "head.draft_vocab_size"]
    assert sorted(result.best_params) == sorted(params)
    rows = _table(sweep)
    assert len(rows) == 3 and all(r["status"] == "COMPLETED" for r in rows)
    assert result.best_value == pytest.approx(max(float(r[METRIC]) for r in rows))
    sampled = set()
    for r in rows:
        job = sweep / r["job"]
        cfg, export = _job_cfg(job), json.loads((job / "export" / "config.json").read_text())
        assert 1e-4 <= cfg.train.lr <= 3e-3 and cfg.train.ttt_steps in (3, 5, 7) and 0.6 <= cfg.train.step_decay <= 1.0
        assert cfg.head.draft_vocab_size in (4096, 8192, 16384, 32000)
        assert export["draft_vocab_size"] == cfg.head.draft_vocab_size  # the trial's value reached training
        assert float(r["train.lr"]) == pytest.approx(cfg.train.lr)
        sampled.add((cfg.train.lr, cfg.train.ttt_steps))
    assert len(sampled) == 3  # three different trials, not one repeated


def test_submitit_local_jobs_run_in_their_own_processes_and_failures_are_tabled(datasets_dir, tmp_path):
    sweep = tmp_path / "sweep-local"
    # ttt_steps=0 is refused by the config check: that job fails, the other still completes
    out = _train_multirun(datasets_dir, sweep, ["hydra/launcher=processes", "train.ttt_steps=2,0", "logger=none"])
    assert out.returncode != 0  # Hydra reports the failed job
    assert list((sweep / ".submitit").glob("*/*_0_log.out"))  # submitit ran the jobs
    rows = {r["job"]: r for r in _table(sweep)}
    assert rows["0"]["status"] == "COMPLETED" and float(rows["0"][METRIC]) >= 1.0
    assert rows["1"]["status"] == "FAILED" and "ttt_steps" in rows["1"]["error"]
    assert "job 1: ConfigError" in (sweep / RESULTS_MD).read_text()


@pytest.mark.parametrize("entry,tasks", [("train", 8), ("extract", 1)])
def test_slurm_preset_takes_the_layout_from_topology(entry, tasks):
    """train: one srun task per GPU (DDP ranks); extract: one per vLLM replica (TP=8 inside)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from eagle3.stages.compose import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose(
            entry,
            ["hydra/launcher=slurm", "topology=gpu8_tp8", "topology.num_nodes=2", "hydra.launcher.partition=h200"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.gpus_per_node, launcher.tasks_per_node) == (2, 8, tasks)
    assert launcher.partition == "h200" and launcher.timeout_min == 240  # conf/local/slurm.yaml
