"""`python -m eagle3.stages.replay_export export_dir=<export> dataset_dir=<dataset>`: train-side
acceptance of an exported head on a hidden-state dataset, with no vLLM
(eagle3/evaluation/diagnostics/head_replay.py).

    python -m eagle3.stages.replay_export export_dir=outputs/run/export dataset_dir=data/<fingerprint> \\
        [target=<target dir>] [split=val|all] [num_draft_tokens=3] [max_answer_tokens=128] [out=<file>]

Keys: conf/replay_export.yaml and its schema ReplayExportConfig (eagle3/config/cli.py).
Prints both train-side figures for the same positions: the uniform estimate and the
round-structured replay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from eagle3.config.cli import ReplayExportConfig
from eagle3.config.errors import ConfigError
from eagle3.config.schema import typed
from eagle3.evaluation.diagnostics.head_replay import load_exported_head, train_side_figures
from eagle3.evaluation.export_info import read_export
from eagle3.stages.compose import register_replay_export_config
from eagle3.util.atomic import write_text


def run(cfg: Any) -> dict[str, float]:
    """The CLI's stage (cfg: the composed config, or a ReplayExportConfig): the export's head on
    the dataset; the figures printed (and written to out)."""
    from omegaconf import OmegaConf

    missing = sorted(OmegaConf.missing_keys(cfg)) if OmegaConf.is_config(cfg) else []
    if missing:
        raise ConfigError(
            f"missing required key(s) {', '.join(missing)}: python -m eagle3.stages.replay_export "
            f"export_dir=<export dir> dataset_dir=<hidden-state dataset dir>"
        )
    c = typed(cfg, ReplayExportConfig)
    target = c.target or read_export(c.export_dir).target
    head, _ = load_exported_head(c.export_dir, target)
    out = train_side_figures(
        head,
        c.dataset_dir,
        num_draft_tokens=c.num_draft_tokens,
        max_answer_tokens=c.max_answer_tokens or None,
        split=c.split.value,
        first_span_only=c.first_span_only,
        device=c.device or ("cuda" if torch.cuda.is_available() else "cpu"),
    )
    for k, v in out.items():
        print(f"{k:>24}: {v:.4f}")
    if c.out:
        write_figures(Path(c.out), out)
    return out


def write_figures(path: Path, figures: dict[str, float]) -> None:
    """The figures as JSON at ``path``, whole or not at all (a full disk leaves the previous file)."""
    write_text(path, json.dumps(figures, indent=2))


def _main() -> None:
    import hydra

    register_replay_export_config()

    @hydra.main(version_base="1.3", config_path="../../conf", config_name="replay_export")
    def main(cfg) -> None:
        run(cfg)

    main()


if __name__ == "__main__":
    _main()
