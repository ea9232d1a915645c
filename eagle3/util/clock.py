"""The wall time a stage has run, its process's imports included: what a stage records as its
cost (``extract_seconds`` in a dataset's provenance) and a time budget counts."""

from __future__ import annotations

import os
import time

_IMPORTED = time.monotonic()


def process_seconds() -> float:
    """Wall seconds since this process started, from /proc where it exists, else since this
    module was imported."""
    try:
        with open("/proc/self/stat") as f:
            # field 22 (starttime, clock ticks after boot); fields after the ")" of the command name
            start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


# the most a process spends before the stage is called (imports, Hydra's composition): a process
# older than this at the stage's start is a longer-lived one (a notebook, the test suite)
MAX_STARTUP_S = 60.0


class StageClock:
    """Seconds since a stage was called, plus its process's start-up when the stage is what the
    process runs (an entrypoint); a stage called inside a longer-lived process counts from its call."""

    def __init__(self) -> None:
        self.entered = time.monotonic()
        before = process_seconds()
        self.startup = before if before <= MAX_STARTUP_S else 0.0

    def seconds(self) -> float:
        return self.startup + time.monotonic() - self.entered


class Deadline:
    """A point on a stage's clock (``at_s`` seconds of ``StageClock.seconds()``) after which a
    part of the stage starts no new work: a time budget's share of it. ``first_batch``: the most
    work the first batch may take, before the stage has measured its own pace (None: no cap): a
    batch sized without that pace could run far past the deadline unseen."""

    def __init__(self, clock: StageClock, at_s: float, what: str, first_batch: int | None = None) -> None:
        self.clock, self.at_s, self.what, self.first_batch = clock, float(at_s), what, first_batch

    def left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.at_s - self.clock.seconds()

    def passed(self) -> bool:
        return self.left() <= 0.0
