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


# whether a clock of this process has counted its start-up: one stage pays it, the first; a later
# stage of the same process (polish.py's rounds: extract, then train, then the next round) did not
# import or compose anything, and counting the process's age again would charge it the stages before
_startup_counted = False


class StageClock:
    """Seconds since a stage was called, plus its process's start-up when the stage is what the
    process runs (an entrypoint, its first stage); a stage called inside a longer-lived process, or
    after another stage of the same process, counts from its call."""

    def __init__(self) -> None:
        global _startup_counted
        self.entered = time.monotonic()
        before = process_seconds()
        self.startup = before if before <= MAX_STARTUP_S and not _startup_counted else 0.0
        _startup_counted = True

    @property
    def counts_process_start(self) -> bool:
        """Whether seconds() includes the process's start-up: only then is this stage's start a
        process's start (what a time budget plans as ``start_s``)."""
        return self.startup > 0.0

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
