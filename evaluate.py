"""Measure an exported EAGLE-3 head's real acceptance with vLLM (conf/evaluate.yaml).

python evaluate.py export_dir=<dir> [dataset_dir=<dir>] [eval.num_draft_tokens=5] [logger=wandb]
python evaluate.py --cfg job --resolve
"""

import hydra
from omegaconf import DictConfig

from eagle3.stages.compose import register_evaluate_config

register_evaluate_config()


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig):
    from eagle3.stages.evaluate import run

    return run(cfg)


if __name__ == "__main__":
    main()
