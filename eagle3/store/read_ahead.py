"""A DataLoader that reads ahead in a thread of its own process (``num_workers`` 0).

With no worker processes the training step's own thread reads and collates every batch: on a GPU
the device sits idle while it does. Worker processes take the read off that thread but hand each
batch over through shared memory, which the training process then maps and pins again. A thread
of the training process shares its memory: it collates the next ``depth`` batches straight into
their final (pinned) buffers while the step's thread launches the step. The copies that fill a
batch release the GIL, so the two threads overlap.

The batches, their order and a resumed run's position are those of the plain DataLoader: the
thread runs the same iterator, one batch at a time, into a queue of ``depth`` batches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch

_END = object()  # the iterator is exhausted


class _Failure:
    """An exception the reading thread raised, re-raised in the consumer's thread."""

    def __init__(self, error: BaseException):
        self.error = error


def _read(source: Iterator[Any], out: queue.Queue[Any], stop: threading.Event) -> None:
    """The reading thread: ``source``'s batches into ``out``, then the end or the failure."""
    try:
        for batch in source:
            if not _put(out, batch, stop):
                return
        _put(out, _END, stop)
    except BaseException as error:  # handed to the consumer, which raises it with its traceback
        _put(out, _Failure(error), stop)


def _put(out: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    # a consumer that stopped early (max_steps mid-pass) never drains the queue: poll the stop flag
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class ReadAheadIterator(Iterator[Any]):
    """The batches of ``source``, read by a daemon thread at most ``depth`` batches ahead."""

    def __init__(self, source: Iterator[Any], depth: int):
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # the thread holds the queue and the flag, not this iterator: a dropped iterator is
        # collected, and its __del__ stops the thread (within a poll of _put)
        self._thread = threading.Thread(
            target=_read, args=(source, self._queue, self._stop), name="eagle3-read-ahead", daemon=True
        )
        self._thread.start()

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            raise item.error
        return item

    def close(self) -> None:
        """Stop the reading thread (it ends at its next batch) and wait for it."""
        self._stop.set()
        self._done = True
        self._thread.join(timeout=5)

    def __del__(self) -> None:
        self._stop.set()


class ReadAheadLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """A DataLoader (length, sampler and all, as Lightning expects) whose passes are read
    ``read_ahead`` batches ahead by a thread of this process; ``num_workers`` must be 0."""

    def __init__(self, *args: Any, read_ahead: int = 2, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.num_workers != 0:
            raise ValueError(f"ReadAheadLoader: reads in this process; expected num_workers=0, got {self.num_workers}")
        if read_ahead < 1:
            raise ValueError(f"ReadAheadLoader.read_ahead: expected >= 1 batches, got {read_ahead}")
        self.read_ahead = int(read_ahead)
        # each pass's thread and stop flag (not the iterator, whose __del__ stops a dropped pass)
        self._readers: list[tuple[threading.Thread, threading.Event]] = []

    def __iter__(self) -> ReadAheadIterator:  # type: ignore[override]
        it = ReadAheadIterator(super().__iter__(), self.read_ahead)
        self._readers = [r for r in self._readers if r[0].is_alive()] + [(it._thread, it._stop)]
        return it

    def close(self) -> None:
        """Stop the reading threads of this loader's passes and wait for them (the end of a fit:
        a pass stopped at max_steps leaves its thread waiting on a full queue, and a sweep may
        train again in the same process)."""
        for _, stop in self._readers:
            stop.set()
        for thread, _ in self._readers:
            thread.join(timeout=5)
        self._readers = []
