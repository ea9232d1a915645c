"""What one extraction of stored hidden states is given, in three small values the stage builds
once: the job (which dataset, what is on disk, this node's part), the capture setup (how the
target runs) and the timing (the stage's clock and a time budget's deadlines)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from eagle3.config.dataset import CaptureConfig
from eagle3.config.target import TopologyConfig
from eagle3.extraction.existing import FoundDataset
from eagle3.extraction.identity import DatasetIdentity
from eagle3.extraction.samples import RegenMachine
from eagle3.util.clock import Deadline, StageClock


@dataclass(frozen=True)
class ExtractionJob:
    """The dataset to write: its identity and fingerprint inputs, what was found where it lives,
    and this process's part (``shard_index`` of ``num_shards``) of a multi-node extraction."""

    identity: DatasetIdentity
    inputs: dict[str, Any]
    found: FoundDataset
    num_shards: int = 1
    shard_index: int = 0

    @property
    def repair(self) -> bool:
        """Damaged shards of a complete dataset: only they are captured again."""
        return bool(self.found.damaged)


@dataclass(frozen=True)
class CaptureSetup:
    """How the target runs: the capture group, the machine's topology, the capture dtype, where
    regeneration runs and the size of the draft vocabulary stored with the dataset."""

    capture: CaptureConfig
    topology: TopologyConfig
    dtype: torch.dtype
    regen: RegenMachine
    draft_vocab_size: int


def _no_deadline(samples: int) -> Deadline | None:
    return None


def _no_estimate(tokens: int) -> float | None:
    return None


@dataclass(frozen=True)
class ExtractionTiming:
    """The stage's clock (its seconds are recorded as ``extract_seconds``) and a time budget's
    ends: of regeneration, of the capture of ``n`` samples (asked when the capture starts), and
    the estimated seconds to capture ``n`` tokens (None: no rate for this machine)."""

    clock: StageClock
    regen_deadline: Deadline | None = None
    capture_deadline: Callable[[int], Deadline | None] = _no_deadline
    capture_estimate: Callable[[int], float | None] = _no_estimate
