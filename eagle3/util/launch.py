"""How ranks are started: externally (torchrun or srun), never by Lightning re-running the script.

Lightning's own DDP launcher re-executes ``sys.argv`` once per extra device; under Hydra
that re-composes the config, re-resolves the run dir and, in a multirun, starts the whole
sweep again in every child (the known Lightning/Hydra pitfall). So a multi-device topology
must be started by torchrun or srun, which Lightning detects from their environment
variables; ``check_external_launch`` refuses anything else with the command to use.

All ranks of one launch must share one Hydra run dir (checkpoints, summary.json, resume),
but Hydra's default ``${now:...}`` differs between processes that start in different
seconds. ``launch_run_id`` names the run dir from the launcher's own job id instead, which
every rank of one launch sees and the next launch does not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime

RUN_ID_ENV = "EAGLE3_RUN_ID"  # explicit: the same value on every rank/node of one launch
TIME_FORMAT = "%Y-%m-%d_%H-%M-%S"


class LaunchError(RuntimeError):
    """The processes were started in a way that cannot give the configured topology."""


def _int(env: Mapping[str, str], key: str, default: int = 1) -> int:
    try:
        return int(env.get(key, default))
    except ValueError:
        return default


def under_torchrun(env: Mapping[str, str]) -> bool:
    return "TORCHELASTIC_RUN_ID" in env and "WORLD_SIZE" in env


def under_srun(env: Mapping[str, str]) -> bool:
    # a task srun started (not an interactive shell): srun sets the step's id in each task;
    # sbatch's one copy of the batch script has SLURM_NTASKS (the allocation's) but no step id
    return (
        "SLURM_NTASKS" in env
        and "SLURM_PROCID" in env
        and "SLURM_STEP_ID" in env
        and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")
    )


def in_batch_script(env: Mapping[str, str]) -> bool:
    """sbatch's batch script itself (one process) in an allocation of several tasks: no srun step."""
    return (
        _int(env, "SLURM_NTASKS") > 1
        and "SLURM_STEP_ID" not in env
        and "SLURM_JOB_ID" in env
        and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")
    )


def launch_run_id(env: Mapping[str, str] | None = None, now: datetime | None = None) -> str:
    """A run-dir name every rank of one multi-process launch agrees on.

    EAGLE3_RUN_ID if set; else, when several ranks were started, the launcher's job id
    (srun: ``slurm-<job>.<step>``; torchrun: ``torchrun-<rdzv id>``); else the start time
    (one process: Hydra's usual timestamp).
    """
    env = os.environ if env is None else env
    if env.get(RUN_ID_ENV):
        return str(env[RUN_ID_ENV])
    if under_srun(env) and _int(env, "SLURM_NTASKS") > 1:
        step = env.get("SLURM_STEP_ID")
        return f"slurm-{env.get('SLURM_JOB_ID', 'job')}" + (f".{step}" if step else "")
    if under_torchrun(env) and _int(env, "WORLD_SIZE") > 1:
        rdzv_id = env.get("TORCHELASTIC_RUN_ID", "none")
        if rdzv_id and rdzv_id != "none":  # --standalone draws a fresh uuid; --rdzv-id is the user's
            return f"torchrun-{rdzv_id}"
        raise LaunchError(
            "torchrun without a run id: its ranks cannot agree on one Hydra run dir (TORCHELASTIC_RUN_ID=none). "
            "Start it with --standalone (one node) or --rdzv-id=<job id> (several nodes), or pass "
            f"hydra.run.dir=<dir>, or set {RUN_ID_ENV}=<name> on every node"
        )
    return (now or datetime.now()).strftime(TIME_FORMAT)


def check_external_launch(devices: int, num_nodes: int, env: Mapping[str, str] | None = None) -> None:
    """Refuse a multi-process topology unless torchrun/srun started exactly that many ranks."""
    env = os.environ if env is None else env
    world = int(devices) * int(num_nodes)
    started_by, started = None, 1
    if under_torchrun(env):
        started_by, started = "torchrun", _int(env, "WORLD_SIZE")
    elif under_srun(env):
        started_by, started = "srun", _int(env, "SLURM_NTASKS")
    if world == 1 and started == 1:
        return
    layout = f"topology: devices x num_nodes = {devices} x {num_nodes} = {world} ranks"
    if started_by is None:
        raise LaunchError(
            f"{layout}, but this is a single process: start the ranks externally, e.g.\n"
            f"  torchrun --standalone --nproc_per_node {devices} train.py <overrides>        (one node)\n"
            f"  srun --nodes {num_nodes} --ntasks-per-node {devices} python train.py <overrides>   (SLURM)\n"
            "or `-m hydra/launcher=slurm` (submitit starts the tasks with srun). Lightning re-running the "
            "script per device is not supported: it fights Hydra's multirun. See docs/scaling.md."
        )
    if started != world:
        raise LaunchError(
            f"{layout}, but {started_by} started {started}; make them agree "
            f"(e.g. topology.devices={started // max(1, int(num_nodes))})"
        )


def extraction_shard(num_shards: int, shard_index: int, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(num_shards, shard_index) of this extract process: the config's, or, when srun started
    several extract tasks and the config leaves num_shards=1, task SLURM_PROCID of
    SLURM_NTASKS (so ``srun --ntasks-per-node=<dp> python extract.py`` splits by itself)."""
    env = os.environ if env is None else env
    if int(num_shards) == 1 and under_srun(env) and _int(env, "SLURM_NTASKS") > 1:
        return _int(env, "SLURM_NTASKS"), _int(env, "SLURM_PROCID", 0)
    if int(num_shards) == 1 and in_batch_script(env):
        # one process, whatever the allocation's task count: it extracts the whole dataset (a
        # single vLLM with extract_tp GPUs is a legitimate sbatch --ntasks=n job); part 0 of n
        # would leave the other parts to no one
        print(
            f"SLURM_NTASKS={env.get('SLURM_NTASKS')} but no SLURM_STEP_ID (SLURM_PROCID="
            f"{env.get('SLURM_PROCID', '<unset>')}): this is sbatch's one copy of the batch script, not one of "
            f"{env.get('SLURM_NTASKS')} tasks: extracting the whole dataset as one part. To split it over the "
            "tasks, start them with srun: srun python extract.py <overrides>, then "
            f"python extract.py <overrides> num_shards={env.get('SLURM_NTASKS')} merge=true"
        )
    return int(num_shards), int(shard_index)


def tasks_per_node(task_name: str, devices: int, extract_dp: int) -> int:
    """Processes SLURM starts per node: training runs one rank per device (Lightning);
    extraction one per vLLM replica (extract_dp), each replica spawning its own TP workers."""
    return int(extract_dp) if str(task_name) == "extract" else int(devices)
