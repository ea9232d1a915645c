"""Export a training checkpoint as a vLLM/speculators eagle3 directory (conf/export.yaml).

    python export.py ckpt=outputs/train/runs/<time>/checkpoints/last.ckpt [out=<dir>] [num_draft_tokens=3]

out: null is the checkpoint's run dir's export/ (where train.py writes it). The checkpoint
carries everything needed (eagle3/training/checkpoint_io.py); the target is not loaded. The
export's owner (eagle3/serving/export_dir.py) writes it, keeping what a previous export there
holds beside it, and publishes it as train.py does: its training record (from the run dir beside
the checkpoint), the serving advice, its model card (README.md) and, with push_to_hub=<org/name>,
its upload (checked before anything is written: eagle3/serving/hub_push.py). Prints the `vllm
serve` command with the advised number of draft tokens and the loads at which the head pays off
(eagle3/serving/advice.py), then the export directory as its last stdout line, for scripts.

    python export.py ckpt=<checkpoint> push_to_hub=<org/name> [hub_private=false]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.config.cli import ExportCliConfig
from eagle3.config.schema import typed
from eagle3.training.checkpoint_io import checkpoint_head

__all__ = ["ExportCliConfig", "checkpoint_head", "run"]


def run(cfg: Any) -> str:
    """The CLI's stage (cfg: the composed config, or an ExportCliConfig)."""
    c = typed(cfg, ExportCliConfig)
    from eagle3.serving.export_dir import publish_export, run_dir_of, write_export
    from eagle3.serving.hub_push import HubPushError, preflight

    # push_to_hub: the token and the Hub checked before anything is written
    if c.push_to_hub:
        preflight(c.push_to_hub, c.hub_private, note="nothing was exported")
    head, meta = checkpoint_head(c.ckpt, c.num_draft_tokens)
    written = write_export(head, meta, c.out or Path(c.ckpt).parent.parent / "export")
    out = written.directory
    retry = f"python export.py ckpt={c.ckpt} out={out} push_to_hub={c.push_to_hub}"
    run_dir = run_dir_of(c.ckpt)
    published = publish_export(
        out, run_dir=run_dir, ckpt=c.ckpt, push_to_hub=c.push_to_hub, hub_private=c.hub_private, retry=retry
    )
    for line in written.lines + published.lines:
        print(line)
    if published.push_failed:
        raise HubPushError(published.push_failed)
    print(out)
    return str(out)
