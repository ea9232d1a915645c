"""train.py plus a probe: what each rank trained and validated on, for test_ddp.py beside it.

Run under torchrun exactly like train.py (same conf/, same Hydra run dir rules):

    torchrun --standalone --nproc_per_node 2 <this file> experiment=tiny_test topology=cpu_ddp2 ...

Each rank writes ``<run dir>/probe-rank<r>.json``: one entry per batch, each the list of
its samples' fingerprints (sha1 of the token ids), so a test can compare ranks' data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import hydra
import lightning as L
import torch
from omegaconf import DictConfig

from eagle3.stages.compose import register_configs

register_configs()
# the clone's conf/, wherever under tests/ this file sits
CONF = next(p / "conf" for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def sample_fingerprints(input_ids: torch.Tensor, segment_ids: torch.Tensor) -> list[str]:
    """One fingerprint per packed sample of a [1, T] batch row."""
    ids, seg = input_ids[0], segment_ids[0]
    return [hashlib.sha1(ids[seg == s].numpy().tobytes()).hexdigest()[:16] for s in torch.unique(seg).tolist()]


class RecordBatches(L.Callback):
    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir)
        self.record: dict = {"train": [], "val": [], "world_size": None, "rank": None, "strategy": None}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.record["train"].append(sample_fingerprints(batch["input_ids"].cpu(), batch["segment_ids"].cpu()))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.state.fn == "fit":  # validations inside fit; one list per validation pass
            if batch_idx == 0:
                self.record["val"].append([])
            self.record["val"][-1].append(sample_fingerprints(batch["input_ids"].cpu(), batch["segment_ids"].cpu()))

    def on_fit_end(self, trainer, pl_module):
        self.record.update(
            world_size=trainer.world_size,
            rank=trainer.global_rank,
            strategy=type(trainer.strategy).__name__,
            backend=torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        )
        (self.out_dir / f"probe-rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="train")
def main(cfg: DictConfig):
    from eagle3.stages.train import run

    return run(cfg, extra_callbacks=[RecordBatches(cfg.paths.output_dir)])


if __name__ == "__main__":
    main()
