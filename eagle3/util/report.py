"""Two helpers every stage uses to tell people about time: a duration in words, and lines to
the log (Hydra prints them and writes them to the run's log file)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def minutes(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def report(lines: list[str]) -> None:
    """Each line to the log: Hydra prints it and writes it to the run's log file."""
    for line in lines:
        log.info(line)


def say(lines: list[str]) -> None:
    """Each line to stdout as it is (scripts read it: the export path is train.py's last line)
    and to the run's log file (Hydra's file handler on the root logger), not twice to the console."""
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for line in lines:
        print(line, flush=True)
        record = log.makeRecord(log.name, logging.INFO, __file__, 0, line, (), None)
        for handler in files:
            handler.handle(record)
