"""`python -m eagle3.evaluate export_dir=<dir> [dataset_dir=<dir>] ...`: real acceptance of an
exported head, measured by vLLM (the stage: eagle3/stages/evaluate.py; config: conf/evaluate.yaml).
``evaluate`` and ``evaluate_trained`` are importable from here, as the stage's library calls."""

from __future__ import annotations

from eagle3.stages.evaluate import evaluate, evaluate_trained, run

__all__ = ["evaluate", "evaluate_trained", "run"]


def _main() -> None:
    import hydra

    @hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
    def main(cfg) -> float:
        return run(cfg)

    main()


if __name__ == "__main__":
    _main()
