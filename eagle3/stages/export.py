"""Export a training checkpoint as a vLLM/speculators eagle3 directory (conf/export.yaml).

    python -m eagle3.export ckpt=outputs/train/runs/<time>/checkpoints/last.ckpt [out=<dir>] [num_draft_tokens=3]

out: null is the checkpoint's run dir's export/ (where train.py writes it). The checkpoint
carries everything needed (eagle3/training/export.py); the target is not loaded. Prints the
export directory as its last stdout line, for scripts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from eagle3.config.schema import typed
from eagle3.training.export import export_checkpoint

__all__ = ["ExportCliConfig", "export_checkpoint", "run"]


@dataclass
class ExportCliConfig:
    """Primary schema of `python -m eagle3.export` (``base_export`` in Hydra's ConfigStore)."""

    ckpt: str = MISSING
    out: Optional[str] = None
    num_draft_tokens: Optional[int] = None


def run(cfg: Any) -> str:
    """The CLI's stage (cfg: the composed config, or an ExportCliConfig)."""
    c = typed(cfg, ExportCliConfig)
    out = export_checkpoint(c.ckpt, c.out, c.num_draft_tokens)
    for line in _serving(out):
        print(line)
    print(out)
    return str(out)


def _serving(export_dir: Any) -> list[str]:
    """The ``vllm serve`` command and the loads at which the head pays off (serving.json when
    bench/serving_speedup.py measured it, else the rule on the run's acceptance.json)."""
    from pathlib import Path

    from eagle3.evaluation.serving_advice import advice_from_acceptance_file, serving_lines

    config = json.loads((Path(export_dir) / "config.json").read_text())["speculators_config"]
    advice = advice_from_acceptance_file(export_dir, Path(export_dir) / "acceptance.json")
    k = int(config["proposal_methods"][0]["speculative_tokens"])
    return serving_lines(export_dir, config["verifier"]["name_or_path"], k, advice)
