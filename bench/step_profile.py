"""Where a Lightning training step spends host time, and what makes the host wait for the GPU.

A callback for the benches: over ``steps`` optimizer steps after ``start`` it runs
torch.profiler (host ops and CUDA kernels) and, on CUDA, torch's sync debug mode, which flags
every call that blocks the host on the device (``.item()``, a pageable copy, ``nonzero``...).
Each distinct blocking call is reported once with its count and the stack that made it: a
host that waits for step N cannot build batch N+1 while the GPU runs step N, and the GPU then
idles between steps (``train/data_wait_frac``).

    trainer = L.Trainer(..., callbacks=[StepProfile(start=8, steps=5, out="profile.txt")])
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from pathlib import Path

import lightning as L
import torch


def _frames(stack: list[traceback.FrameSummary]) -> str:
    """The frames of ours, Lightning's and torch's python code, innermost last, without this
    module and the warnings machinery."""
    keep = [
        f
        for f in stack
        if not f.filename.endswith(("step_profile.py", "warnings.py"))
        and any(k in f.filename for k in ("eagle3", "lightning", "torch", "bench"))
    ]
    return "".join(traceback.format_list(keep[-8:]))


class StepProfile(L.Callback):
    def __init__(self, start: int, steps: int, out: str | Path):
        self.start, self.steps, self.out = int(start), int(steps), Path(out)
        self.syncs: Counter[str] = Counter()
        self._prof: torch.profiler.profile | None = None
        self._step = 0
        self._showwarning = warnings.showwarning

    def _record(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            self.syncs[f"{message}\n{_frames(traceback.extract_stack())}"] += 1
        else:
            self._showwarning(message, category, filename, lineno, file, line)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._step != self.start:
            return
        cuda = torch.cuda.is_available()
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        self._prof = torch.profiler.profile(activities=acts)
        self._prof.__enter__()
        if cuda:
            warnings.showwarning = self._record
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._step += 1
        if self._prof is None or self._step != self.start + self.steps:
            return
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = self._showwarning
            torch.cuda.synchronize()
        self._prof.__exit__(None, None, None)
        self._write(self._prof)
        self._prof = None

    def _write(self, prof: torch.profiler.profile) -> None:
        avg = prof.key_averages()
        device_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        parts = [
            f"# {self.steps} steps after step {self.start}",
            f"# blocking calls (torch.cuda sync debug mode): {sum(self.syncs.values())}",
        ]
        for where, n in self.syncs.most_common():
            parts.append(f"## x{n}: {where}")
        parts.append("# host ops by self CPU time")
        parts.append(avg.table(sort_by="self_cpu_time_total", row_limit=35, max_name_column_width=70))
        parts.append("# by total CPU time (the loop's phases)")
        parts.append(avg.table(sort_by="cpu_time_total", row_limit=35, max_name_column_width=70))
        parts.append(f"# by {device_key}")
        parts.append(avg.table(sort_by=device_key, row_limit=25, max_name_column_width=70))
        self.out.write_text("\n".join(parts))
        print(f"profile: {self.out} ({sum(self.syncs.values())} blocking calls)", flush=True)
