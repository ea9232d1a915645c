"""Export a training checkpoint as a vLLM/speculators eagle3 directory (conf/export.yaml).

python export.py ckpt=<run>/checkpoints/last.ckpt [out=<dir>] [num_draft_tokens=3]
"""

import hydra
from omegaconf import DictConfig

from eagle3.stages.compose import register_export_config

register_export_config()


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def main(cfg: DictConfig):
    from eagle3.stages.export import run

    return run(cfg)


if __name__ == "__main__":
    main()
