"""ShardWriter's writer threads (``background=True``): full shards are handed to
``writer_threads`` threads that write them (shard, then manifest) while capture goes on. At
most ``writer_threads`` shards wait behind those being written; the first failure is kept
and raised in the caller's thread by its next call, and later shards are not written."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any, Callable

from eagle3.store.disk import DiskSpaceError
from eagle3.store.layout import StoreError


class BackgroundWrites:
    """Mixed into ShardWriter, whose ``__init__`` sets the fields used here (directory,
    writer_threads, _state, _inflight_ids, _jobs, _threads, _error, _error_reported) and
    which provides ``_take_pending``, ``_pending`` and ``_write``."""

    # declared for the type checker only: ShardWriter sets and defines them
    directory: Path
    writer_threads: int
    _state: threading.Lock
    _inflight_ids: set[str]
    _jobs: queue.Queue[tuple[int, list[str], list[Any]] | None] | None
    _threads: list[threading.Thread]
    _error: BaseException | None
    _error_reported: bool
    _pending: list[tuple[str, Any]]
    _take_pending: Callable[[], tuple[int, list[str], list[Any]]]
    _write: Callable[[int, list[str], list[Any]], Any]

    def _submit(self) -> None:
        """Hand the queued samples to the writer threads (blocks while writer_threads shards wait)."""
        self._raise_writer_error()
        if not self._pending:
            return
        self._enqueue(*self._take_pending())

    def _enqueue(self, index: int, ids: list[str], samples: list[Any]) -> None:
        if not self._threads:
            self._jobs = queue.Queue(maxsize=self.writer_threads)
            self._threads = [
                threading.Thread(target=self._writer_loop, daemon=True, name=f"shard-writer-{k} {self.directory.name}")
                for k in range(self.writer_threads)
            ]
            for t in self._threads:
                t.start()
        with self._state:
            self._inflight_ids.update(ids)
        assert self._jobs is not None  # made with the threads
        self._jobs.put((index, ids, samples))

    def _writer_loop(self) -> None:
        assert self._jobs is not None  # made before the threads start
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:  # after a failure, later shards are not written
                    self._write(*job)
            except BaseException as e:  # re-raised in the caller's thread
                if self._error is None:  # the first failure is the one reported
                    self._error = e
            finally:
                self._jobs.task_done()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            self._error_reported = True
            if isinstance(self._error, DiskSpaceError):  # its own message says what to do: said once
                raise DiskSpaceError(str(self._error)) from None
            raise StoreError(
                f"{self.directory}: writing a shard failed on the writer thread: "
                f"{type(self._error).__name__}: {self._error}"
            ) from self._error

    def _stop_thread(self) -> None:
        if self._threads:
            assert self._jobs is not None  # made with the threads
            for _ in self._threads:
                self._jobs.put(None)
            for t in self._threads:
                t.join()
            self._threads, self._jobs = [], None
