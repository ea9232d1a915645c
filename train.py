"""Train an EAGLE-3 draft head on an extracted hidden-state dataset; export it for vLLM.

python train.py --help            # config groups and overrides
python train.py --cfg job --resolve
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from eagle3.stages.compose import follow_the_machine, register_configs

register_configs()
follow_the_machine(Path(__file__).parent / "conf")  # topology and sizes default to this machine's


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig):
    from eagle3.stages.train import run

    return run(cfg)


if __name__ == "__main__":
    main()
