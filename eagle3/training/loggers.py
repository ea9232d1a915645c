"""W&B as a dashboard: one run per job, grouped by sweep, tagged with the Hydra choices."""

from __future__ import annotations

from pathlib import Path

from eagle3.config.schema import RunConfig, plain
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


def build_logger(cfg: RunConfig, output_dir: Path):
    if cfg.logger.backend == "none":
        return False
    if cfg.logger.backend != "wandb":
        raise ValueError(f"logger.backend: expected wandb|none, got {cfg.logger.backend!r}")
    from lightning.pytorch.loggers import WandbLogger

    choices, sweep_dir, job_num = hydra_context()
    if not choices:
        choices = {"model": cfg.model.name, "data": cfg.data.name}
    tags = [f"{k}:{v}" for k, v in sorted(choices.items())] + list(cfg.logger.tags) + list(cfg.tags)
    group = cfg.logger.group or (Path(sweep_dir).name if sweep_dir else None)
    name = f"{cfg.model.name}-{Path(output_dir).name}" + (f"-job{job_num}" if job_num is not None else "")
    mode, reason = wandb_mode_and_reason(cfg.logger.mode)
    print(f"W&B: {mode} ({reason})")
    return WandbLogger(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        name=name,
        group=group,
        tags=tags,
        save_dir=str(output_dir),
        offline=(mode == "offline"),
        mode=mode,
        config=plain(cfg),
        job_type=cfg.task_name,
        reinit="create_new",  # multirun jobs in one process each get their own run
    )
