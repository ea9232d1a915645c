"""Polish an exported EAGLE-3 head: rounds of new prompts answered by the target, captured,
and trained on with the on-policy objective (eagle3/stages/polish.py); vLLM measures the
start head against the polished one.

python polish.py experiment=smollm2_polish train.init_from=<export dir>
python polish.py --cfg job --resolve
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from eagle3.stages.compose import follow_the_machine, register_polish_config

register_polish_config()
follow_the_machine(Path(__file__).parent / "conf")  # topology and sizes default to this machine's


@hydra.main(version_base="1.3", config_path="conf", config_name="polish")
def main(cfg: DictConfig):
    from eagle3.stages.polish import run

    return run(cfg)


if __name__ == "__main__":
    main()
