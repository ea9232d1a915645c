"""One writer per directory: an flock'd lock file that names its holder.

``DirLock(path, what)`` takes an exclusive ``flock`` on ``path`` and writes the holder's
pid, host, start time and command into it. A second process is refused (or, with
``wait_s``, retries until then) with an error naming that holder. The kernel drops an flock
when the process holding it dies, so a crashed holder's lock is free at once. One case
survives that: a child that inherited the descriptor (a forked worker of a killed run) keeps
the lock alive after its parent. When the recorded holder pid is dead on this host, the lock
is taken over: the file is replaced by a fresh one and locked.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO

from eagle3.util.atomic import pid_alive


class LockHeldError(RuntimeError):
    """Another live process holds the lock; ``holder`` is what it wrote (pid, host, ...)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def _read_holder(path: Path) -> dict:
    try:
        return dict(json.loads(path.read_text() or "{}"))
    except (OSError, ValueError, TypeError):
        return {}


def describe(holder: dict) -> str:
    if not holder.get("pid"):
        return "a process that has not written its pid yet"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"pid {holder['pid']} on host {holder.get('host', '?')} since {started} ({holder.get('command', '?')})"


class DirLock:
    """``with DirLock(dir / ".lock", "another run is writing dir"):`` or ``acquire()`` /
    ``release()``; ``what`` opens the refusal a second process gets."""

    def __init__(self, path: str | Path, what: str, wait_s: float = 0.0):
        self.path, self.what, self.wait_s = Path(path), what, float(wait_s)
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> "DirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        while True:
            f = open(self.path, "a+")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                holder = _read_holder(self.path)
                if self._take_over(holder):
                    continue
                if time.monotonic() >= deadline:
                    raise LockHeldError(
                        f"{self.what}: {self.path} is held by {describe(holder)}; wait for it or stop it", holder
                    ) from None
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            if not self._names_this_file(f):  # replaced by a takeover between open and flock
                f.close()
                continue
            f.seek(0)
            f.truncate()
            f.write(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "started": time.time(),
                        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
                        "what": self.what,
                    }
                )
            )
            f.flush()
            os.fsync(f.fileno())
            self._file = f
            return self

    def _names_this_file(self, f) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return False

    def _take_over(self, holder: dict) -> bool:
        """Replace the lock file of a holder that died on this host (its flock lives on in an
        inherited descriptor). Serialised by a second lock so two newcomers cannot both do it."""
        pid = holder.get("pid")
        if not isinstance(pid, int) or holder.get("host") != socket.gethostname() or pid_alive(pid):
            return False
        with open(self.path.with_name(self.path.name + ".takeover"), "a+") as guard:
            fcntl.flock(guard.fileno(), fcntl.LOCK_EX)
            if _read_holder(self.path).get("pid") != pid:  # someone else took it over meanwhile
                return True
            self.path.unlink(missing_ok=True)
        return True

    def release(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.truncate(0)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
