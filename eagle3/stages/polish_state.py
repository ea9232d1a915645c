"""The polish run dir's state file: the head it started from and each finished round, written
whole after every round (a round killed in the middle is not in it, so a rerun of the same command
redoes that round from the last finished round's export)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from eagle3.config.errors import ConfigError
from eagle3.util.atomic import write_text

STATE = "polish_state.json"


@dataclass
class RoundRecord:
    """One finished round: what it trained on, what it exported, what it measured."""

    round: int
    export_dir: str
    dataset_dir: str
    seconds: float  # wall seconds of the round: answering, capture, training, export, evaluation
    tokens: int  # tokens of the round's dataset (its prompts and the target's answers)
    steps: int  # optimizer steps the round trained
    train_tok_s: Optional[float]  # the fit's tokens/s (summary.json's fit)
    replay_accept_len: Optional[float]  # val/replay_accept_len of the exported head, train-side
    replay_acc_pos: list[float] = field(default_factory=list)  # its rate per draft position
    served: Optional[dict[str, Any]] = None  # vLLM's figures of the round's export (eval_rounds), else None


@dataclass
class PolishState:
    start: str  # train.init_from: the head the first round started from
    seconds: float = 0.0  # wall seconds spent in finished rounds, over every run of this run dir
    start_acceptance: Optional[dict[str, Any]] = None  # vLLM's figures of the start head, once measured
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def head(self) -> str:
        """The head the next round starts from: the last finished round's export, else the start."""
        return self.rounds[-1].export_dir if self.rounds else self.start

    def save(self, run_dir: Path) -> None:
        write_text(run_dir / STATE, json.dumps(asdict(self), indent=1))

    def add(self, record: RoundRecord, run_dir: Path) -> None:
        self.rounds.append(record)
        self.seconds += record.seconds
        self.save(run_dir)


def load_state(run_dir: Path, start: str) -> PolishState:
    """The run dir's state, or a fresh one for ``start``; a run dir that polished another head is
    refused by name (its rounds would continue a head this command did not ask for)."""
    path = run_dir / STATE
    if not path.is_file():
        return PolishState(start=start)
    try:
        raw = json.loads(path.read_text())
        rounds = [RoundRecord(**r) for r in raw.pop("rounds")]
        state = PolishState(**raw, rounds=rounds)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path}: unreadable polish state ({type(e).__name__}: {e}); polish into another run dir "
            "(hydra.run.dir=...) or remove the file to start over from train.init_from"
        ) from None
    if state.start != start:
        raise ConfigError(
            f"{path}: this run dir polishes train.init_from={state.start!r}, got train.init_from={start!r}; "
            "polish the other head into another run dir (hydra.run.dir=...)"
        )
    return state
