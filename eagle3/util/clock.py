"""The wall time a process has run, its imports included: what a stage records as its cost
(``extract_seconds`` in a dataset's provenance) and a time budget counts."""

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
