"""W&B's mode for a run (online, offline, disabled) and why: shared by train.py's logger
(eagle3/training/loggers.py) and evaluate's own run (eagle3/stages/evaluate.py)."""

from __future__ import annotations

import os

WANDB_HOST = "api.wandb.ai"


def wandb_mode_and_reason(configured: str | None) -> tuple[str, str]:
    """Online when the user is logged in (WANDB_API_KEY, or the netrc entry `wandb login`
    writes), offline otherwise or when asked; and why, in words."""
    if configured:
        return str(configured), f"logger.mode={configured}"
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], f"WANDB_MODE={os.environ['WANDB_MODE']}"
    if os.environ.get("WANDB_API_KEY"):
        return "online", "WANDB_API_KEY is set"
    if _netrc_has_wandb():
        return "online", f"logged in (netrc entry for {WANDB_HOST})"
    return "offline", "no W&B credentials (wandb login or WANDB_API_KEY); `wandb sync` the run later"


def wandb_mode(configured: str | None) -> str:
    return wandb_mode_and_reason(configured)[0]


def _netrc_has_wandb() -> bool:
    import netrc

    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(WANDB_HOST) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
