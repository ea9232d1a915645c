"""`python -m eagle3.export ckpt=<checkpoint> [out=<dir>] [num_draft_tokens=K]`: a training
checkpoint as a vLLM/speculators eagle3 directory (the stage: eagle3/stages/export.py; config:
conf/export.yaml). ``export_checkpoint`` is importable from here."""

from __future__ import annotations

from eagle3.stages.export import ExportCliConfig, export_checkpoint, run

__all__ = ["ExportCliConfig", "export_checkpoint", "run"]


def _main() -> None:
    import hydra
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_export", node=ExportCliConfig)

    @hydra.main(version_base="1.3", config_path="../conf", config_name="export")
    def main(cfg) -> str:
        return run(cfg)

    main()


if __name__ == "__main__":
    _main()
