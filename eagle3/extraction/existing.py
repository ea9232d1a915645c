"""What an extraction finds on disk before it starts: this config's dataset (named by this
version's fingerprint, else by the first scheme's), or this node's part of a multi-node
extraction; complete, or with the shards it must capture again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from eagle3.config.choices import VerifyMode
from eagle3.extraction.identity import DatasetIdentity, regen_note
from eagle3.extraction.locate import legacy_dataset_path
from eagle3.store import Manifest
from eagle3.store.merge import part_dir
from eagle3.store.reader import damaged_shards

console = Console(stderr=True)


@dataclass(frozen=True)
class FoundDataset:
    """``dataset_dir``: where this run writes; ``done``: its manifest when complete; ``damaged``:
    (shard file, what is wrong) for each shard to capture again; ``verify``: how the shards were
    checked (capture.verify); ``first_scheme``: named by the first fingerprint scheme."""

    dataset_dir: Path
    done: Manifest | None
    damaged: list[tuple[str, str]]
    verify: str
    first_scheme: bool = False

    @property
    def complete(self) -> bool:
        """Complete and whole: nothing to do."""
        return self.done is not None and not self.damaged

    def say_complete(self) -> None:
        done = self.done
        assert done is not None
        checked = "size, header, sha256" if self.verify == VerifyMode.full.value else "size, header"
        cut = done.provenance.get("budget_cut")
        cut_note = f"; cut short by a time budget at {cut['samples']} of {cut['rendered_samples']}" if cut else ""
        console.print(
            f"dataset already complete ({done.num_samples} samples{cut_note}, {done.num_tokens} tokens, "
            f"{regen_note(done)}; every shard checked: {checked}): nothing to do"
        )


def find_existing_dataset(
    identity: DatasetIdentity, dataset_dir: Path, num_shards: int, shard_index: int, verify: str
) -> FoundDataset:
    """This config's dataset at ``dataset_dir`` (its fingerprint's name) or the first scheme's name;
    this node's part when ``num_shards`` > 1 and no complete dataset is there. Its shards are
    checked (``verify``) and each damaged one is announced as repaired, except in a dataset of
    the first scheme: the store refuses to write into that one, and its refusal says what to do."""
    done = Manifest.read_complete(dataset_dir)
    first_scheme = False
    if done is None and Manifest.read_complete(old := legacy_dataset_path(identity)) is not None:
        # this config's dataset, named by the first scheme
        dataset_dir, done, first_scheme = old, Manifest.read_complete(old), True
    if num_shards > 1 and done is None:
        # this node's part of a multi-node extraction, merged afterwards (eagle3/store/merge.py)
        dataset_dir = part_dir(dataset_dir, shard_index, num_shards)
        done = Manifest.read_complete(dataset_dir)
    damaged = damaged_shards(dataset_dir, done, verify) if done is not None else []
    for file, why in [] if first_scheme else damaged:
        console.print(f"[yellow]repairing {file} (its samples are captured again): {why}")
    return FoundDataset(dataset_dir, done, damaged, verify, first_scheme)
