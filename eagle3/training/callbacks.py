"""Training callbacks: token throughput (what users compare across runs and peers)."""

from __future__ import annotations

import time

import lightning as L
import torch


class TokenThroughput(L.Callback):
    """Logs train/tokens_per_s (sample tokens in packed batches, no padding, summed over ranks) per step."""

    def __init__(self, window: int = 20):
        self.window = window
        self._t0: float | None = None
        self._times: list[tuple[float, int]] = []
        self.total_tokens = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._t0 is None:
            return
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - self._t0
        # real tokens only: rows padded to a fixed shape (train.compile) must not inflate tok/s
        tokens = int((batch["segment_ids"] >= 0).sum()) * trainer.world_size
        self.total_tokens += tokens
        self._times = (self._times + [(dt, tokens)])[-self.window :]
        secs = sum(t for t, _ in self._times)
        if secs > 0:
            tps = sum(n for _, n in self._times) / secs
            pl_module.log("train/tokens_per_s", tps, on_step=True, batch_size=1)
            pl_module.log("tok/s", tps, prog_bar=True, logger=False, batch_size=1)
