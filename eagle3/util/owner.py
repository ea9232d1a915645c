"""Who holds a lock or owns a temporary directory, recorded so that another process can tell
whether that holder is gone without guessing.

A pid and a host name do not say it: two containers with the same host name (``--network host``)
and their own PID namespaces see different processes under one pid, and on storage shared by
several machines a pid means nothing to the other machines. A record therefore holds, beside
pid and host, the kernel's boot id (``/proc/sys/kernel/random/boot_id``: one per running kernel),
the PID namespace (the inode of ``/proc/self/ns/pid``) and the process's start time (field 22 of
``/proc/<pid>/stat``, clock ticks since boot: a pid reused by a later process has another), and
the holder keeps a heartbeat: the file's mtime, refreshed every ``HEARTBEAT_S`` by a thread.

A holder is gone when it is provably dead in this process's namespace (same boot id and PID
namespace, and the pid is not running, is a zombie, or runs a process started at another time),
or when its heartbeat is older than ``STALE_S``, a generous bound (a live holder refreshes it 60
times in that span). A holder that keeps its heartbeat is never judged gone, whatever its pid says
here; nor is a holder provably alive here (same boot id, PID namespace, pid and start time),
whatever its heartbeat says: a process stopped by SIGSTOP (or a debugger) beats no more, yet
resumes where it was, and would then write beside the process that took its lock over. The
heartbeat's age rules only where liveness cannot be checked: another machine, another PID namespace.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from eagle3.util.atomic import pid_alive

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
HEARTBEAT_S = 30.0  # how often a holder refreshes its heartbeat
STALE_S = 30 * 60.0  # a heartbeat this old says the holder is gone, wherever it ran


def boot_id() -> str | None:
    """This kernel's boot id (None where /proc does not give one)."""
    try:
        return Path(BOOT_ID_PATH).read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> int | None:
    """The inode of this process's PID namespace (None where /proc does not give it)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None
    when it cannot be read (no such process, or /proc hides it)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # the name, in parentheses, may hold spaces
    try:
        return int(fields[19])  # field 22 counted from 1; fields[0] is field 3 (the state)
    except (IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``/proc/<pid>/stat`` field 3: R, S, D, T stopped, t traced,
    Z zombie, ...); None when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0] if fields else None


def identity(pid: int | None = None) -> dict:
    """What names a process beyond its pid: host, boot id, PID namespace, start time."""
    pid = os.getpid() if pid is None else pid
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "pid_ns": pid_namespace(),
        "start_ticks": start_ticks(pid),
    }


def _here(record: dict) -> int | None:
    """``record``'s pid when it ran under this kernel and in this PID namespace, else None."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    ours = boot_id(), pid_namespace()
    if None in ours or (record.get("boot_id"), record.get("pid_ns")) != ours:
        return None
    return pid


def provably_dead(record: dict) -> bool:
    """True only when ``record``'s process ran under this kernel and in this PID namespace and
    is no longer running (its pid is free, a zombie, or names a process started at another time).
    A record from another namespace, another machine, or without these fields is never provably dead."""
    pid = _here(record)
    if pid is None:
        return False
    if not pid_alive(pid):
        return True
    recorded, now = record.get("start_ticks"), start_ticks(pid)
    if isinstance(recorded, int) and now is not None and now != recorded:
        return True
    return process_state(pid) in ("Z", "X")


def provably_alive(record: dict) -> bool:
    """True only when ``record``'s process runs here now: same kernel, PID namespace, pid and start
    time, and not a zombie. Stopped (state T) counts as alive: it resumes where it was."""
    pid = _here(record)
    if pid is None or not pid_alive(pid):
        return False
    recorded = record.get("start_ticks")
    if not isinstance(recorded, int) or start_ticks(pid) != recorded:
        return False
    return process_state(pid) not in (None, "Z", "X")


def stopped_note(record: dict) -> str:
    """``"; it is stopped ..., resume it ... or end it"`` for a holder alive here but stopped
    (SIGSTOP, Ctrl-Z, a debugger), else ``""``: the one case its heartbeat says nothing of."""
    if not provably_alive(record) or process_state(record["pid"]) not in ("T", "t"):
        return ""
    pid = record["pid"]
    return (
        f"; it is stopped (state T in /proc/{pid}/stat) and keeps its lock: "
        f"resume it (kill -CONT {pid}) or end it (kill {pid})"
    )


def heartbeat_age(path: str | Path) -> float | None:
    """Seconds since ``path``'s heartbeat (its mtime); None when it is gone."""
    try:
        return max(0.0, time.time() - os.stat(path, follow_symlinks=False).st_mtime)
    except OSError:
        return None


def gone_because(record: dict, heartbeat: str | Path) -> str | None:
    """Why the holder of ``record`` (heartbeat: the file whose mtime it refreshes) is gone, or
    None while it may be working: provably dead here, or silent for more than ``STALE_S`` where
    it cannot be seen (never a holder provably alive here, stopped or not)."""
    if provably_alive(record):
        return None
    if provably_dead(record):
        return f"pid {record['pid']} is no longer running in this PID namespace"
    age = heartbeat_age(heartbeat)
    if age is not None and age > STALE_S:
        return f"no heartbeat for {age / 60:.0f} min (a live holder refreshes it every {HEARTBEAT_S:.0f} s)"
    return None


def write_record(path: str | Path, extra: dict | None = None) -> None:
    """This process's identity (and ``extra``) as JSON at ``path``, whole or not at all."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({**identity(), **(extra or {})}))
    os.replace(tmp, path)


def read_record(path: str | Path) -> dict | None:
    """The record at ``path``; None when absent or unreadable."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class Heartbeat:
    """A daemon thread refreshing the mtime of a file (a path, or an open descriptor) every
    ``HEARTBEAT_S`` until ``stop()``. Forked children do not inherit it: a holder's heartbeat
    ends with the process that started it. ``lost``, when given, is asked before each beat: a
    message when what the beat keeps alive is no longer this process's (a holder resumed after
    its lock was taken over), and then the process is ended at once (SIGTERM) before it writes
    beside the new holder."""

    def __init__(
        self, target: str | Path | int, every_s: float = HEARTBEAT_S, lost: Callable[[], str | None] | None = None
    ):
        self.target = target if isinstance(target, int) else str(target)
        self._lost = lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), name="eagle3-heartbeat", daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            why = self._lost() if self._lost is not None else None
            if why is not None and not self._stop.is_set():
                print(f"[eagle3] ERROR: {why}; this process stops now", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            try:
                os.utime(self.target)
            except OSError:  # removed or closed under us: nothing left to keep alive
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
