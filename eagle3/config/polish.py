"""The primary schema of polish.py (``PolishRunConfig``: train.py's ``RunConfig`` and the ``polish``
group), registered as ``base_polish`` (eagle3/stages/compose.py) and extended by conf/polish.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from eagle3.config.schema import RunConfig


@dataclass
class PolishConfig:
    """What polish.py does around the warm-started head (eagle3/stages/polish.py): rounds of new
    prompts answered by the target, captured, and trained on with the on-policy objective."""

    rounds: int = 2  # rounds at most; each answers, captures, trains from the last round's head, exports
    # wall-clock budget over all rounds (null: none), counted over every run of this run dir (a
    # resumed polish adds to what the state file holds): what is not yet spent, shared evenly by the
    # rounds still to run, is each round's time_budget.minutes, so its answering and capture end at
    # their shares and its training gets the rest (steps_per_round then does not bind)
    minutes: Optional[float] = None
    # conversations each round answers at most (data.max_samples of the round; data.seed + round
    # number draws new self_prompts each round); with minutes, the round's share may end it sooner
    prompts_per_round: int = 64
    steps_per_round: int = 50  # train.max_steps of each round without minutes (its schedule starts over each round)
    # measure each round's export in vLLM (the train.py end-of-run evaluation, eval.*); false:
    # each round reports its train-side replay only, and vLLM measures the first and the last head
    eval_rounds: bool = True


@dataclass
class PolishRunConfig(RunConfig):
    polish: PolishConfig = field(default_factory=PolishConfig)
