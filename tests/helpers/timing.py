"""Time in tests: a clock on which a second passes at every read, a deadline whose seconds left are
scripted, and a bound on how long a block may wait before it fails (a wait that would hang the
suite fails it instead)."""

from __future__ import annotations

import contextlib
import signal

from eagle3.util.clock import Deadline, StageClock


class TickingClock(StageClock):
    """One second passes each time the clock is read: a capture slower than any estimate."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def seconds(self) -> float:
        self.reads += 1
        return float(self.reads)


class ScriptedDeadline(Deadline):
    """A deadline whose seconds left are given, one per question (the last one repeats)."""

    def __init__(self, left: list[float], what: str = "regeneration", first_batch: int | None = None) -> None:
        super().__init__(StageClock(), 0.0, what, first_batch)
        self._left = list(left)

    def left(self) -> float:
        return self._left.pop(0) if len(self._left) > 1 else self._left[0]


@contextlib.contextmanager
def at_most(seconds: int):
    """Fail (instead of hanging the suite) if the block runs past ``seconds``."""

    def _late(*_):
        raise TimeoutError(f"still waiting after {seconds} s: the lock wait is unbounded")

    old = signal.signal(signal.SIGALRM, _late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
