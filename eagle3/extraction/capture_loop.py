"""The capture loop: prompts through a capture backend into a sink (a dataset's ShardWriter),
with a progress bar, a time budget's deadline and the throughput line that scripts grep.
extract.py's stage and bench/extract_throughput.py both run this loop."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from eagle3.target_model.backend import CaptureBackend
from eagle3.target_model.records import CapturedSample
from eagle3.util.clock import Deadline
from eagle3.util.faults import fault
from eagle3.util.report import minutes

console = Console(stderr=True)

Prompt = tuple[str, torch.Tensor, torch.Tensor]  # (sample_id, input_ids [T], loss_mask [T])


class RecordSink(Protocol):
    """Where captured records go: a ShardWriter, or anything with its ``add``."""

    def add(self, sample_id: str, record: CapturedSample) -> None: ...


class DropRecords:
    """A sink that keeps nothing: the capture alone, no disk."""

    def add(self, sample_id: str, record: CapturedSample) -> None:
        pass


@dataclass(frozen=True)
class CaptureResult:
    tokens: int  # captured
    samples: int  # captured
    seconds: float  # the loop's wall time
    cut: str | None  # why the deadline stopped the capture (None: every prompt captured)


def manifest_capture_route(backend_name: str, backend: CaptureBackend) -> str:
    """What the manifest records as the capture route: ``hf``, ``vllm/native`` or
    ``vllm/native_host_copy`` (the route the vLLM backend resolved at start)."""
    route = getattr(backend, "route", None)
    return f"{backend_name}/{route}" if route else backend_name


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]capture"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TextColumn("{task.fields[tok_s]:>8.0f} tok/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


def capture_into(
    backend: CaptureBackend, prompts: Sequence[Prompt], sink: RecordSink, deadline: Deadline | None = None
) -> CaptureResult:
    """Capture ``prompts`` into ``sink``; stops at ``deadline`` and says why."""
    t0, tokens, count, cut = time.perf_counter(), 0, 0, None
    if deadline is not None:
        console.print(f"capture ends by the time budget's deadline: within {minutes(max(0.0, deadline.left()))}")
    with _progress() as bar:
        task = bar.add_task("capture", total=len(prompts), tok_s=0.0)
        # records come back per batch (longest first), paired with the id they were sent with
        for sample_id, record in backend.capture_with_ids(prompts):
            sink.add(sample_id, record)
            fault("capture")
            tokens += int(record.token_ids.numel())
            count += 1
            bar.update(task, advance=1, tok_s=tokens / max(1e-9, time.perf_counter() - t0))
            if deadline is not None and count < len(prompts) and deadline.passed():
                cut = (
                    f"{deadline.what} deadline (time_budget): {count} of {len(prompts)} samples captured "
                    f"in {time.perf_counter() - t0:.0f} s"
                )
                break
    seconds = time.perf_counter() - t0
    if cut is not None:
        console.print(f"[yellow]capture stopped early: {cut}; the dataset is finished with them", soft_wrap=True)
    _say_throughput(backend, tokens, seconds)
    return CaptureResult(tokens, count, seconds, cut)


def _say_throughput(backend: CaptureBackend, tokens: int, seconds: float) -> None:
    stats = getattr(backend, "stats", None)
    read = getattr(stats, "read_seconds", None)
    console.print(
        f"captured {tokens:,} tokens in {seconds:.1f} s ({tokens / max(1e-9, seconds):,.0f} tok/s)"
        + (f"; reading the connector's files: {read:.1f} s" if read is not None else ""),
        soft_wrap=True,  # one line in a log too: scripts grep it
    )
