"""Export a training checkpoint as a vLLM/speculators eagle3 directory (conf/export.yaml).

    python export.py ckpt=outputs/train/runs/<time>/checkpoints/last.ckpt [out=<dir>] [num_draft_tokens=3]

out: null is the checkpoint's run dir's export/ (where train.py writes it). The checkpoint
carries everything needed (eagle3/training/checkpoint_io.py); the target is not loaded. The
export gets its training record (from the run dir beside the checkpoint) and its model card,
README.md (eagle3/serving/model_card.py); push_to_hub=<org/name> uploads it (checked before
anything is written: eagle3/serving/hub_push.py). Prints the `vllm serve` command with the advised
number of draft tokens and the loads at which the head pays off (eagle3/serving/advice.py), then
the export directory as its last stdout line, for scripts.

    python export.py ckpt=<checkpoint> push_to_hub=<org/name> [hub_private=false]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3.config.cli import ExportCliConfig
from eagle3.config.schema import typed
from eagle3.training.checkpoint_io import export_checkpoint
from eagle3.util.atomic import write_text

__all__ = ["ExportCliConfig", "export_checkpoint", "run"]


def run(cfg: Any) -> str:
    """The CLI's stage (cfg: the composed config, or an ExportCliConfig)."""
    c = typed(cfg, ExportCliConfig)
    from eagle3.serving.advice import head_sha256
    from eagle3.serving.hub_push import preflight, push, push_line
    from eagle3.serving.model_card import write_card
    from eagle3.serving.serve_command import export_serving_lines

    # push_to_hub: the token and the Hub checked before anything is written
    hub = preflight(c.push_to_hub, c.hub_private, note="nothing was exported") if c.push_to_hub else None
    sha, kept = _kept_metadata(c)
    old_record = _kept_record(c)
    out = export_checkpoint(c.ckpt, c.out, c.num_draft_tokens)
    if sha is not None and sha == head_sha256(out):  # the directory was replaced; same weights: same figures
        for name, text in kept.items():
            write_text(out / name, text)  # whole or absent: a torn one would break every later export here
    _record_training(c, out, old_record)
    lines = export_serving_lines(out)  # the `vllm serve` command and where the head pays off
    write_card(out)  # after the advice those lines wrote (serving.json): the card shows the same
    if hub is not None:
        lines.append(push_line(push(out, hub), hub))
    for line in lines:
        print(line)
    print(out)
    return str(out)


def _run_dir(ckpt: str) -> Path | None:
    """train.py's run dir of a checkpoint in its checkpoints/ (summary.json beside them), else None."""
    path = Path(ckpt)
    run_dir = path.parent.parent
    return run_dir if path.parent.name == "checkpoints" and (run_dir / "summary.json").is_file() else None


def _kept_record(c: ExportCliConfig) -> tuple[str | None, dict | None]:
    """(weights' sha256, training record) of the export about to be replaced, for a checkpoint
    that has no run dir beside it any more: the same weights keep the record they were trained with."""
    from eagle3.serving.advice import head_sha256
    from eagle3.serving.training_record import META_FILE, RECORD_KEY

    old = Path(c.out) if c.out else Path(c.ckpt).parent.parent / "export"
    meta = old / META_FILE
    record = json.loads(meta.read_text()).get(RECORD_KEY) if meta.is_file() and _run_dir(c.ckpt) is None else None
    return (head_sha256(old), record) if record else (None, None)


def _record_training(c: ExportCliConfig, out: Path, old: tuple[str | None, dict | None]) -> None:
    """eagle3_meta.json's training record: from the checkpoint's run dir, else the replaced
    export's for the same weights, else none (the card says not recorded)."""
    from eagle3.serving.advice import head_sha256
    from eagle3.serving.training_record import set_training_record, write_training_record

    run_dir = _run_dir(c.ckpt)
    if run_dir is not None:
        write_training_record(out, run_dir, c.ckpt)
    elif old[1] is not None and old[0] == head_sha256(out):
        set_training_record(out, old[1])


def _kept_metadata(c: ExportCliConfig) -> tuple[str | None, dict[str, str]]:
    """(weights' sha256, serving.json and acceptance.json) of the export about to be replaced,
    put back only if the new weights are byte-identical (the same checkpoint exported again)."""
    from eagle3.serving.advice import FILE_NAME, head_sha256

    old = Path(c.out) if c.out else Path(c.ckpt).parent.parent / "export"
    serving = old / FILE_NAME
    if not serving.is_file():
        return None, {}
    sha = json.loads(serving.read_text()).get("head_sha256")
    if not sha or sha != head_sha256(old):
        return None, {}
    return sha, {n: (old / n).read_text() for n in (FILE_NAME, "acceptance.json") if (old / n).is_file()}
