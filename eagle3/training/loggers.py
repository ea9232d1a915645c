"""W&B as a dashboard: one run per job, grouped by sweep, tagged with the Hydra choices."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagle3.config.training import LoggerConfig
from eagle3.util.wandb_mode import wandb_mode_and_reason

_TAGGED_GROUPS = ("model", "layers", "data", "topology", "capture", "experiment")


def hydra_context() -> tuple[dict[str, str], str | None, str | None]:
    """(group choices, sweep dir, job number) of the running Hydra job, if any."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except Exception:  # not under @hydra.main (notebooks, tests calling run())
        return {}, None, None
    choices = {k: str(v) for k, v in hc.runtime.choices.items() if k in _TAGGED_GROUPS and v is not None}
    mode = str(hc.mode)
    if mode.endswith("MULTIRUN"):
        return choices, str(hc.sweep.dir), str(hc.job.num)
    return choices, None, None


def build_logger(
    logger_cfg: LoggerConfig,
    output_dir: Path,
    config: Mapping[str, Any],
    *,
    model_name: str,
    data_name: str,
    tags: Sequence[str],
    job_type: str,
):
    """The W&B logger of logger.*, or False for backend=none. ``config``: the run's config as
    plain data, as W&B records it (the values that ran). The run is named by ``model_name`` and
    tagged by the Hydra group choices (outside a Hydra job: the model and data names), logger.tags
    and the run's own ``tags``; ``job_type``: the task name."""
    if logger_cfg.backend == "none":
        return False
    if logger_cfg.backend != "wandb":
        raise ValueError(f"logger.backend: expected wandb|none, got {logger_cfg.backend!r}")
    from lightning.pytorch.loggers import WandbLogger

    choices, sweep_dir, job_num = hydra_context()
    if not choices:
        choices = {"model": model_name, "data": data_name}
    tags = [f"{k}:{v}" for k, v in sorted(choices.items())] + list(logger_cfg.tags) + list(tags)
    group = logger_cfg.group or (Path(sweep_dir).name if sweep_dir else None)
    name = f"{model_name}-{Path(output_dir).name}" + (f"-job{job_num}" if job_num is not None else "")
    mode, reason = wandb_mode_and_reason(logger_cfg.mode)
    print(f"W&B: {mode} ({reason})")
    return WandbLogger(
        project=logger_cfg.project,
        entity=logger_cfg.entity,
        name=name,
        group=group,
        tags=tags,
        save_dir=str(output_dir),
        offline=(mode == "offline"),
        mode=mode,
        config=dict(config),
        job_type=job_type,
        reinit="create_new",  # multirun jobs in one process each get their own run
    )
