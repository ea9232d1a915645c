"""TokenThroughput in a real Lightning loop: a loader slower than the step shows up as
train/data_wait_frac, a step slower than the loader does not. TrainEta's time left comes
from the steps it timed."""

from __future__ import annotations

import re
import time

import lightning as L
import pytest
import torch
from helpers.trainers import quiet_cpu_trainer

from eagle3.training.callbacks import TokenThroughput, TrainEta


class _SlowBatches(torch.utils.data.Dataset):
    def __init__(self, n: int, delay: float):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return {"x": torch.randn(4), "segment_ids": torch.zeros(8, dtype=torch.long)}  # 8 real tokens


class _SlowStep(L.LightningModule):
    def __init__(self, delay: float):
        super().__init__()
        self.lin, self.delay = torch.nn.Linear(4, 1), delay

    def training_step(self, batch, batch_idx):
        time.sleep(self.delay)
        return self.lin(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _run(loader_delay: float, step_delay: float, window: int = 50, batches: _SlowBatches | None = None) -> dict:
    # 10 batches per pass, 16 steps: the second pass's first fetch is counted as well
    counter = TokenThroughput(window=window)
    trainer = quiet_cpu_trainer(max_steps=16, callbacks=[counter])
    batches = batches if batches is not None else _SlowBatches(10, loader_delay)
    trainer.fit(_SlowStep(step_delay), torch.utils.data.DataLoader(batches, batch_size=None))
    return {**{k: float(v) for k, v in trainer.callback_metrics.items()}, "whole_fit_wait": counter.data_wait_frac()}


def test_a_slow_loader_is_seen_as_data_wait():
    starved = _run(loader_delay=0.06, step_delay=0.01)  # expected ~0.06 / 0.07 = 0.86
    assert 0.6 < starved["train/data_wait_frac"] < 1.0
    # tokens/s counts step compute only: 8 tokens per >= 0.01 s (<= 800/s), well above the
    # ~115/s it would read if the loader's 0.06 s were counted (loose: CI machines are busy)
    assert 250 < starved["train/tokens_per_s"] <= 800
    fed = _run(loader_delay=0.0, step_delay=0.06)
    assert fed["train/data_wait_frac"] < 0.25
    assert 0.6 < starved["whole_fit_wait"] < 1.0 and fed["whole_fit_wait"] < 0.25


def test_the_whole_fits_data_wait_is_not_the_last_windows():
    """A loader slow for its first 8 fetches only: the logged window (the last 2 steps) reads no
    wait, the fraction summary.json reports (every timed step) most of the fit's time."""

    class _SlowFirst(_SlowBatches):
        fetches = 0

        def __getitem__(self, i):
            _SlowFirst.fetches += 1
            if _SlowFirst.fetches > 8:
                self.delay = 0.0
            return super().__getitem__(i)

    got = _run(loader_delay=0.06, step_delay=0.01, window=2, batches=_SlowFirst(10, 0.06))
    assert got["train/data_wait_frac"] < 0.3
    whole = got["whole_fit_wait"]
    # ~7 x 0.06 s waited against ~15 x 0.01 s of steps (each step's overhead on a loaded CPU lowers it)
    assert whole is not None and 0.3 < whole < 0.95 and whole > got["train/data_wait_frac"] + 0.2


def test_train_eta_logs_the_time_left_from_the_steps_it_timed(caplog):
    eta = TrainEta(max_steps=40, skip=2, timed=5)
    trainer = quiet_cpu_trainer(
        max_steps=40,
        callbacks=[eta],
    )
    with caplog.at_level("INFO", logger="eagle3.util.report"):
        trainer.fit(_SlowStep(0.05), torch.utils.data.DataLoader(_SlowBatches(10, 0.0), batch_size=None))
    got = re.fullmatch(
        r"train: steps (\d+)-(\d+) took ([\d.]+) s each here: ~(\d+) s left for (\d+) steps .*", eta.line
    )
    assert got, eta.line
    first, last, per, secs, left = (float(g) for g in got.groups())
    assert last - first == 5 and left == 40 - last  # timed 5 steps, then the steps still to run
    assert per >= 0.05 and secs == pytest.approx(left * per, abs=1)  # each step sleeps 50 ms
    assert [r.getMessage() for r in caplog.records].count(eta.line) == 1  # logged once
