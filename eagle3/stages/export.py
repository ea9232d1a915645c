"""Export a training checkpoint as a vLLM/speculators eagle3 directory (conf/export.yaml).

    python export.py ckpt=outputs/train/runs/<time>/checkpoints/last.ckpt [out=<dir>] [num_draft_tokens=3]

out: null is the checkpoint's run dir's export/ (where train.py writes it). The checkpoint
carries everything needed (eagle3/training/checkpoint_io.py); the target is not loaded. Prints the
`vllm serve` command with the advised number of draft tokens and the loads at which the head
pays off (eagle3/serving/advice.py), then the export directory as its last stdout
line, for scripts.
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
    from eagle3.serving.advice import export_serving_lines, head_sha256

    sha, kept = _kept_metadata(c)
    out = export_checkpoint(c.ckpt, c.out, c.num_draft_tokens)
    if sha is not None and sha == head_sha256(out):  # the directory was replaced; same weights: same figures
        for name, text in kept.items():
            write_text(out / name, text)  # whole or absent: a torn one would break every later export here
    for line in export_serving_lines(out):  # the `vllm serve` command and where the head pays off
        print(line)
    print(out)
    return str(out)


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
