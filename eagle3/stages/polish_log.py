"""polish.py's W&B panels: one run per polish run dir (its id from the dir, so a resumed polish
adds to the same run), stepped by round: polish/accept_len (vLLM's where it measured the round,
else the train-side replay's), polish/replay_accept_len, polish/served_accept_len, and the rate
per draft position, polish/acc_pos<k>."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

from eagle3.config.training import LoggerConfig
from eagle3.stages.polish_state import RoundRecord


def round_metrics(record: RoundRecord) -> dict[str, float]:
    """The round's panels: vLLM's figures where measured, the replay's otherwise."""
    out: dict[str, float] = {"polish/round": float(record.round), "polish/tokens": float(record.tokens)}
    if record.replay_accept_len is not None:
        out["polish/replay_accept_len"] = float(record.replay_accept_len)
    served = record.served or {}
    if served.get("mean_acceptance_length") is not None:
        out["polish/served_accept_len"] = float(served["mean_acceptance_length"])
    per_position = served.get("per_position_acceptance_rate") or record.replay_acc_pos
    for k, rate in enumerate(per_position):
        out[f"polish/acc_pos{k}"] = float(rate)
    accept = out.get("polish/served_accept_len", out.get("polish/replay_accept_len"))
    if accept is not None:
        out["polish/accept_len"] = accept
    return out


def log_round(logger_cfg: LoggerConfig, run_dir: Path, record: RoundRecord) -> None:
    """The round's panels into the polish run's W&B run (logger.backend=wandb; none: nothing)."""
    if logger_cfg.backend != "wandb":
        return
    import wandb

    from eagle3.util.wandb_mode import wandb_mode

    run_id = "polish-" + hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]
    run: Any = wandb.init(
        project=logger_cfg.project,
        entity=logger_cfg.entity,
        group=logger_cfg.group,
        tags=list(logger_cfg.tags),
        job_type="polish",
        id=run_id,
        resume="allow",
        mode=cast(Any, wandb_mode(logger_cfg.mode)),
        dir=str(run_dir),
        reinit="create_new",
    )
    try:
        run.log(round_metrics(record), step=record.round)
    finally:
        run.finish()
