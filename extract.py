"""Run the target over chat data and write the hidden-state dataset (+ draft vocab) to disk.

python extract.py --help            # config groups and overrides
python extract.py --cfg job --resolve
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from eagle3.stages.compose import follow_the_machine, register_configs

register_configs()
follow_the_machine(Path(__file__).parent / "conf")  # topology and sizes default to this machine's


@hydra.main(version_base="1.3", config_path="conf", config_name="extract")
def main(cfg: DictConfig):
    from eagle3.stages.extract import run

    return run(cfg)


if __name__ == "__main__":
    main()
