"""One writer per directory: an flock'd lock file that names its holder.

``DirLock(path, what)`` takes an exclusive ``flock`` on ``path`` and writes the holder's
pid, host, start time and command into it. A second process is refused (or, with
``wait_s``, retries until then) with an error naming that holder. The kernel drops an flock
when the process holding it dies, so a crashed holder's lock is free at once. One case
survives that: a child that inherited the descriptor (a forked worker of a killed run) keeps
the lock alive after its parent. The record names the holder beyond pid and host (boot id, PID
namespace, start time: eagle3/util/owner.py) and the holder refreshes the file's mtime while it
holds it (a heartbeat). The lock is taken over (the file replaced by a fresh one and locked, with
a message) only when its holder is provably dead in this PID namespace of this kernel, or silent
for ``owner.STALE_S`` where its liveness cannot be checked: a holder in another container or on
another machine sharing the storage is waited for, never taken over while its heartbeat goes on;
a holder provably alive here is never taken over, even stopped (SIGSTOP) with its heartbeat
silent: the refusal says it is stopped. A holder that resumes to find its lock file replaced
(taken over while it was silent elsewhere) ends itself, loudly, at its next heartbeat.

Waiting (``wait_s`` > 0) prints who holds the lock when the wait starts, again when the holder
changes and every ``WAIT_REPORT_S``, and gives up after ``wait_s`` without a heartbeat from
the holder (each beat starts the wait again: a holder at work is waited for however long it
works) with ``LockHeldError`` naming the holder. The waits that follow another run (a vocabulary added to a dataset being
written, the ranks waiting for the online pre-pass, a second merge) use ``lock_wait_s()``:
``EAGLE3_LOCK_WAIT_S`` seconds (``inf`` waits for ever), by default ``DEFAULT_WAIT_S`` (30 min).

The lock file is opened with ``O_NOFOLLOW`` (a symlink planted in a group-writable data dir is
refused, never written through) and without ``O_TRUNC``: it is emptied and rewritten only once
the lock is held.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import IO

from eagle3.util import owner

WAIT_ENV = "EAGLE3_LOCK_WAIT_S"
DEFAULT_WAIT_S = 1800.0  # 30 min: longer than any merge, vocabulary or token pre-pass of a usual run
WAIT_REPORT_S = 60.0  # a waiting process says again who it waits for this often


class LockHeldError(RuntimeError):
    """Another live process holds the lock; ``holder`` is what it wrote (pid, host, ...)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def lock_wait_s() -> float:
    """How long a lock wait lasts before giving up: ``$EAGLE3_LOCK_WAIT_S`` seconds (``inf``:
    no bound), else ``DEFAULT_WAIT_S``."""
    raw = os.environ.get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{WAIT_ENV}: expected seconds (a number, or inf), got {raw!r}") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"{WAIT_ENV}: expected seconds >= 0 (or inf), got {raw!r}")
    return value


def _open_nofollow(path: Path) -> IO[str]:
    """``path`` opened read-write, created (mode 0666 less the umask) if absent, never through a
    symlink and never truncated."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP or path.is_symlink():
            raise OSError(
                e.errno, f"{path}: a lock file must not be a symlink (points to {os.readlink(path)!r}); remove it"
            ) from None
        raise
    return os.fdopen(fd, "r+")


def _read_holder(path: Path) -> dict:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        with os.fdopen(fd) as f:
            return dict(json.loads(f.read(65536) or "{}"))
    except (OSError, ValueError, TypeError):
        return {}


def _mtime(path: Path) -> float | None:
    """The lock file's mtime: its holder's heartbeat (owner.Heartbeat refreshes it)."""
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return None


def describe(holder: dict) -> str:
    if not holder.get("pid"):
        return "a process that has not written its pid yet"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"pid {holder['pid']} on host {holder.get('host', '?')} since {started} ({holder.get('command', '?')})"


def _duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "for ever"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _lost(path: Path, what: str, inode: int) -> str | None:
    """Why the holder of ``path`` (its lock file of inode ``inode``) no longer holds it (the
    file replaced: taken over while this process was stopped or silent), or None while it does.
    Takes no DirLock: the heartbeat thread must not keep one alive past its last reference."""
    try:
        if os.stat(path, follow_symlinks=False).st_ino == inode:
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    return (
        f"{what}: this process (pid {os.getpid()}) lost its lock {path}: another process took it over "
        f"({describe(_read_holder(path))}) while this one sent no heartbeat"
    )


class DirLock:
    """``with DirLock(dir / ".lock", "another run is writing dir"):`` or ``acquire()`` /
    ``release()``; ``what`` opens the refusal a second process gets. ``wait_s``: how long to
    wait for the holder (0: refuse at once), telling the user whom it waits for."""

    def __init__(self, path: str | Path, what: str, wait_s: float = 0.0):
        self.path, self.what, self.wait_s = Path(path), what, float(wait_s)
        self._file: IO[str] | None = None
        self._heartbeat: owner.Heartbeat | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> "DirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        # the wait runs out after wait_s of silence, not wait_s in all: each heartbeat of the holder
        # (the lock file's mtime moving on) starts it again, so a holder at work for hours (the
        # online pre-pass regenerating answers) is waited for, and a silent one given up on
        deadline = t0 + self.wait_s
        beat: float | None = None  # the holder's heartbeat last seen
        reported: tuple | None = None  # the holder last printed, and when
        while True:
            f = _open_nofollow(self.path)
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                holder = _read_holder(self.path)
                if self._take_over(holder):
                    continue
                now = time.monotonic()
                seen = _mtime(self.path)
                if self.wait_s > 0 and seen is not None and beat is not None and seen > beat:
                    deadline = now + self.wait_s  # the holder beat: it is at work
                beat = seen if seen is not None else beat
                if now >= deadline:
                    waited = (
                        f"; gave up after waiting {_duration(self.wait_s)} without a heartbeat from its holder "
                        f"({WAIT_ENV} sets how long)"
                    )
                    stopped = owner.stopped_note(holder)
                    raise LockHeldError(
                        f"{self.what}: {self.path} is held by {describe(holder)}{stopped}"
                        f"{waited if self.wait_s > 0 else ''}{'' if stopped else '; wait for it or stop it'}",
                        holder,
                    ) from None
                key = (holder.get("pid"), holder.get("host"))
                if reported is None or reported[0] != key or now - reported[1] >= WAIT_REPORT_S:
                    print(
                        f"[eagle3] waiting for {self.path} ({self.what}): held by {describe(holder)}"
                        f"{owner.stopped_note(holder)}; "
                        f"waited {now - t0:.0f} s, giving up after {_duration(self.wait_s)} without its heartbeat "
                        f"({WAIT_ENV})",
                        file=sys.stderr,
                        flush=True,
                    )
                    reported = (key, now)
                time.sleep(min(0.2, max(0.0, deadline - now)))
                continue
            if not self._names_this_file(f):  # replaced by a takeover between open and flock
                f.close()
                continue
            f.seek(0)
            f.truncate()  # held now: the previous holder's record is replaced
            f.write(
                json.dumps(
                    {
                        **owner.identity(),
                        "started": time.time(),
                        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
                        "what": self.what,
                    }
                )
            )
            f.flush()
            os.fsync(f.fileno())
            self._file = f
            self._heartbeat = owner.Heartbeat(
                f.fileno(),
                owner.HEARTBEAT_S,
                lost=functools.partial(_lost, self.path, self.what, os.fstat(f.fileno()).st_ino),
            )
            return self

    def _names_this_file(self, f) -> bool:
        try:
            return os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return False

    def _take_over(self, holder: dict) -> bool:
        """Replace the lock file of a holder that is gone (its flock lives on in an inherited
        descriptor, or on storage whose locks outlive it): provably dead here, or without a
        heartbeat for ``owner.STALE_S``. Serialised by a second lock so two newcomers cannot
        both do it."""
        why = owner.gone_because(holder, self.path)
        if why is None:
            return False
        with _open_nofollow(self.path.with_name(self.path.name + ".takeover")) as guard:
            fcntl.flock(guard.fileno(), fcntl.LOCK_EX)
            if _read_holder(self.path) != holder:  # someone else took it over meanwhile
                return True
            print(
                f"[eagle3] taking over {self.path} ({self.what}): its holder, {describe(holder)}, is gone: {why}",
                file=sys.stderr,
                flush=True,
            )
            self.path.unlink(missing_ok=True)
        return True

    def release(self) -> None:
        f, self._file = self._file, None
        beat, self._heartbeat = self._heartbeat, None
        if beat is not None:
            beat.stop()
        if f is not None:
            f.truncate(0)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
