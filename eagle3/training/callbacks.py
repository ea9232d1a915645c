"""Training callbacks: token throughput (what users compare across runs and peers), the
share of wall time the step waited for its batch (a starved GPU shows here, not in tok/s),
and the time left as this run's own steps measure it."""

from __future__ import annotations

import time

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar

from eagle3.training.validation_trend import ValidationTrend
from eagle3.util.report import minutes, report


class TokenThroughput(L.Callback):
    """Logs per step, over a window of steps:
    train/tokens_per_s     sample tokens in packed batches (no padding), summed over ranks, per
                           second of step compute (batch start to end)
    train/data_wait_frac   time between one step's end and the next one's start (the loader's
                           fetch, a new pass's prefetch) over that plus the step compute; the
                           gap around a validation is not counted (``data_wait_frac()``: the
                           same over the whole fit, what summary.json's ``fit`` reports)

    On CUDA the times are the device's own (CUDA events at batch start and end, read once they
    have completed): the host never waits for the device here, so it can prepare and copy the
    next batch while the device computes this one; the gap is then the device's idle time
    between two steps. Elsewhere they are the host's clock.
    """

    def __init__(self, window: int = 20):
        self.window = window
        self._t0: float | None = None
        self._t_end: float | None = None  # end of the previous step; None after a validation
        self._wait: float | None = None  # before this step: since _t_end (None: not timed)
        self._times: list[tuple[float | None, float, int]] = []  # (wait, compute, tokens)
        self.total_tokens = 0
        # the whole fit's timed steps (the logged fraction is the window's): waits and their steps' compute
        self.waited_s, self.waited_compute_s = 0.0, 0.0
        # CUDA: (previous step's end event or None, start, end, tokens), not completed yet
        self._pending: list[tuple] = []
        self._start_event: torch.cuda.Event | None = None
        self._end_event: torch.cuda.Event | None = None  # of the previous step; None after a validation

    @staticmethod
    def _on_cuda(pl_module) -> bool:
        return pl_module.device.type == "cuda"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._on_cuda(pl_module):
            self._start_event = start = torch.cuda.Event(enable_timing=True)
            start.record()
            return
        self._t0 = time.perf_counter()
        self._wait = self._t0 - self._t_end if self._t_end is not None else None

    def on_validation_end(self, trainer, pl_module):
        self._t_end = None
        self._end_event = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        tokens = self._tokens(batch) * trainer.world_size
        if self._on_cuda(pl_module):
            if self._start_event is None:
                return
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._end_event, self._start_event, end, tokens))
            self._end_event = end
            self._collect_completed()
        else:
            if self._t0 is None:
                return
            self._t_end = time.perf_counter()
            self._add(self._wait, self._t_end - self._t0, tokens)
        self._log(pl_module)

    @staticmethod
    def _tokens(batch) -> int:
        # real tokens only: rows padded to a fixed shape (train.compile) must not inflate tok/s;
        # the data module counts them on the host (num_tokens), so reading them never waits
        count = batch.get("num_tokens")
        if isinstance(count, torch.Tensor) and count.device.type == "cpu":
            return int(count)
        return int((batch["segment_ids"] >= 0).sum())

    def _collect_completed(self) -> None:
        while self._pending and self._pending[0][2].query():
            before, start, end, tokens = self._pending.pop(0)
            wait = before.elapsed_time(start) / 1e3 if before is not None else None
            self._add(wait, start.elapsed_time(end) / 1e3, tokens)

    def on_train_end(self, trainer, pl_module):
        if self._pending:  # the last steps' events: complete once the device is done
            self._pending[-1][2].synchronize()
            self._collect_completed()

    def data_wait_frac(self) -> float | None:
        """The share of the whole fit's step time spent waiting for batches (None: nothing timed)."""
        whole = self.waited_s + self.waited_compute_s
        return self.waited_s / whole if whole > 0 else None

    def _add(self, wait: float | None, compute: float, tokens: int) -> None:
        self.total_tokens += tokens
        if wait is not None:
            self.waited_s, self.waited_compute_s = self.waited_s + wait, self.waited_compute_s + compute
        self._times = (self._times + [(wait, compute, tokens)])[-self.window :]

    def _log(self, pl_module) -> None:
        # host numbers logged as CPU tensors: Lightning turns a float into a tensor on the
        # module's device, a blocking copy on CUDA, and one wait per step keeps the host from
        # queueing the next step while the GPU runs this one (bench/step_profile.py found it)
        secs = sum(t for _, t, _ in self._times)
        if secs > 0:
            tps = torch.tensor(sum(n for _, _, n in self._times) / secs)
            pl_module.log("train/tokens_per_s", tps, on_step=True, batch_size=1)
            pl_module.log("tok/s", tps, prog_bar=True, logger=False, batch_size=1)
        timed = [(w, t) for w, t, _ in self._times if w is not None]
        if timed:
            waited = sum(w for w, _ in timed)
            frac = torch.tensor(waited / (waited + sum(t for _, t in timed)))
            pl_module.log("train/data_wait_frac", frac, on_step=True, batch_size=1)
            pl_module.log("wait", frac, prog_bar=True, logger=False, batch_size=1)  # in logs without W&B
        if self._on_cuda(pl_module):
            # the allocator's high-water mark (a host-side counter: no wait on the GPU), the figure
            # that says whether a larger batch or target fits beside the head
            peak = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
            pl_module.log("train/peak_gpu_memory_gib", torch.tensor(peak), on_step=True, batch_size=1)


class SparseProgressBar(RichProgressBar):
    """A RichProgressBar that reads the training loss every ``every`` batches. Lightning turns
    every metric logged with ``prog_bar=True`` into a number after every batch, which waits for
    the device: the step therefore logs its loss for the logger only (a device tensor, read when
    the logger writes), and the bar shows ``train/loss`` from the callback metrics, one wait
    per ``every`` steps."""

    def __init__(self, every: int = 20):
        super().__init__()
        self.every = int(every)
        self._shown: dict = {}
        self._reads = 0

    def get_metrics(self, trainer, pl_module):
        if self._reads % self.every == 0 or not trainer.training:
            self._shown = super().get_metrics(trainer, pl_module)
            loss = trainer.callback_metrics.get("train/loss")
            if loss is not None:
                self._shown["loss"] = round(float(loss), 4)
        self._reads += 1
        return self._shown


class TrainEta(L.Callback):
    """Logs once, after ``timed`` optimizer steps of this process (past the first ``skip``,
    which compile and fill the loader), the run's own seconds per step and the minutes left
    to ``max_steps``: the start-of-run estimate (eagle3/planning/cost.py) comes from a table of rates
    measured on a machine alone, this one from the machine as it is now."""

    def __init__(self, max_steps: int, skip: int = 3, timed: int = 10):
        self.max_steps, self.skip, self.timed = int(max_steps), int(skip), int(timed)
        self._start: tuple[int, float] | None = None  # (global step, time) when timing began
        self._seen = 0  # optimizer steps of this process
        self._last_step: int | None = None
        self.line: str | None = None  # what was logged

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.line is not None or step == self._last_step:
            return  # logged already, or an accumulation micro-batch
        self._last_step, self._seen = step, self._seen + 1
        if self._seen == self.skip:
            self._start = (step, time.perf_counter())
        elif self._start is not None and step - self._start[0] >= self.timed:
            per = (time.perf_counter() - self._start[1]) / (step - self._start[0])
            left = max(0, self.max_steps - step)
            self.line = f"train: steps {self._start[0]}-{step} took {per:.2f} s each here: "
            clock = _time_remaining(trainer)
            if clock is not None and clock < left * per:  # train.max_time ends the run first
                self.line += f"train.max_time leaves {minutes(clock)}: ~{int(clock / per):,} more steps"
            else:
                self.line += f"~{minutes(left * per)} left for {left:,} steps (validation not included)"
            if trainer.is_global_zero:
                report([self.line])

    def on_validation_end(self, trainer, pl_module):
        if self._start is not None and self.line is None:
            self._start = None  # a validation inside the window would count as step time: start again
            self._seen = self.skip - 1


def _time_remaining(trainer) -> float | None:
    """Seconds train.max_time still allows (Lightning's Timer), or None without one."""
    from lightning.pytorch.callbacks import Timer

    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    remaining = timer.time_remaining("train") if timer is not None else None
    return float(remaining) if remaining is not None else None


def build_callbacks(
    callbacks_cfg, optimized_metric: str, ckpt_dir, *, max_steps: int, with_logger: bool, progress_bar: bool
) -> tuple:
    """The run's callbacks from callbacks.* (conf/callbacks/): the best-checkpoint saver (the
    exported head is its best), throughput and ETA, the picking metric's trend, optional progress bar, early stopping and
    learning-rate monitor, then `extra` ones instantiated by class path. Returns (checkpoint, all)."""
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint

    ckpt = callbacks_cfg.model_checkpoint
    if int(ckpt.save_top_k) < 1:
        raise ValueError(
            f"callbacks.model_checkpoint.save_top_k: expected >= 1 (the exported head is the best "
            f"checkpoint by {optimized_metric}), got {ckpt.save_top_k}"
        )
    mode = "min" if "loss" in optimized_metric else "max"
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir,
        filename="best-step{step}",
        monitor=optimized_metric,
        mode=mode,
        save_top_k=int(ckpt.save_top_k),
        save_last=bool(ckpt.save_last),
        auto_insert_metric_name=False,
        every_n_train_steps=ckpt.every_n_train_steps,
    )
    callbacks: list[L.Callback] = [
        checkpoint,
        TokenThroughput(),
        TrainEta(int(max_steps)),
        ValidationTrend(optimized_metric),
    ]
    if progress_bar:
        callbacks.append(SparseProgressBar())
    stopping = callbacks_cfg.early_stopping
    if stopping.patience is not None:
        callbacks.append(
            EarlyStopping(
                monitor=optimized_metric,
                mode=mode,
                patience=int(stopping.patience),
                min_delta=float(stopping.min_delta),
            )
        )
    if with_logger and callbacks_cfg.lr_monitor:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    for name, node in (callbacks_cfg.extra or {}).items():
        callback = instantiate(node)
        if not isinstance(callback, L.Callback):
            raise ValueError(f"callbacks.extra.{name}: expected a Lightning Callback, got {type(callback).__name__}")
        callbacks.append(callback)
    return checkpoint, callbacks
