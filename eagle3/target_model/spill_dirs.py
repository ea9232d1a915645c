"""The spill directories of a vLLM capture: where vLLM's connector writes one file per request
until eagle3/target_model/capture_vllm.py reads it back. Files there are transient, but a capture
killed part-way must not leave gigabytes in /dev/shm (memory) behind it.

A directory is named by its owner (``eagle3-vllm-capture-<pid>@<host>-<random>``) and removed on
release, on SIGTERM (a handler ends vLLM's processes, removes it, then lets the signal end the
process as it would have) and, after a SIGKILL or the OOM killer, by the next capture on this
host: ``make_spill_dir`` removes the directories whose owner pid is no longer running here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

from eagle3.util.atomic import pid_alive
from eagle3.util.processes import end_descendants

SHM_DIR = "/dev/shm"
SHM_MIN_FREE = 8 * 2**30  # /dev/shm is used for spill files only with this much room
SPILL_PREFIX = "eagle3-vllm-capture-"
# <prefix><owner pid>@<host>-<mkdtemp's random part, no dash in it>
_SPILL_NAME = re.compile(rf"^{re.escape(SPILL_PREFIX)}(\d+)@(.+)-[^-]+$")


def default_spill_dir() -> str | None:
    """/dev/shm where it exists with room (the files then live in memory only: no second
    pass over the data on disk), else the system temp dir (None)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return SHM_DIR if st.f_bavail * st.f_frsize >= SHM_MIN_FREE else None


def remove_stale_spill_dirs(parent: str | Path) -> list[str]:
    """Remove the spill directories in ``parent`` left by captures of this host whose process
    is gone (SIGKILL, OOM); returns their paths. Directories of live processes, of other hosts
    (a shared ``spill_dir``) and anything not named by ``make_spill_dir`` are left alone."""
    host, removed = socket.gethostname(), []
    try:
        entries = list(os.scandir(str(parent)))
    except OSError:
        return []
    for entry in entries:
        m = _SPILL_NAME.match(entry.name)
        if m is None or m.group(2) != host or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or pid_alive(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    if removed:
        print(
            f"[eagle3] removed {len(removed)} spill dir(s) of vLLM captures that were killed: {', '.join(removed)}",
            file=sys.stderr,
            flush=True,
        )
    return removed


def make_spill_dir(spill_dir: str | None = None) -> str:
    """A new spill directory named by this process (in ``spill_dir``, else ``default_spill_dir()``,
    else the system temp dir), after removing those of dead captures there; removed on SIGTERM
    until ``release_spill_dir``."""
    parent = spill_dir or default_spill_dir() or tempfile.gettempdir()
    remove_stale_spill_dirs(parent)
    path = tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}@{socket.gethostname()}-", dir=parent)
    _LIVE_SPILLS.add(path)
    _install_sigterm_cleanup()
    return path


def release_spill_dir(path: str) -> None:
    """Remove a spill directory of ``make_spill_dir`` (and, with none left, the SIGTERM handler)."""
    shutil.rmtree(path, ignore_errors=True)
    _LIVE_SPILLS.discard(path)
    if not _LIVE_SPILLS:
        _uninstall_sigterm_cleanup()


_LIVE_SPILLS: set[str] = set()
_sigterm: dict = {}  # while installed: {"previous": the handler before ours, "owner": our pid}


def _install_sigterm_cleanup() -> None:
    # Python handlers live in the main thread only; an ignored SIGTERM ends nothing: no handler
    if _sigterm or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm.update(previous=previous, owner=os.getpid())


def _uninstall_sigterm_cleanup() -> None:
    if not _sigterm or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:  # else a later handler may chain to ours: kept
        previous = _sigterm["previous"]
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        _sigterm.clear()


def _on_sigterm(signum, frame) -> None:
    """Remove the live spill directories, then do what SIGTERM did before: the previous Python
    handler, or the default action (the process ends, killed by SIGTERM), after ending vLLM's
    processes (its engine core has no watch on this process and would outlive it)."""
    previous = _sigterm.get("previous")
    owner = _sigterm.get("owner") == os.getpid()  # not a forked child that inherited the handler
    ending = not callable(previous)
    if owner and ending:
        end_descendants()  # first: none of them writes into the spill once it is removed
    if owner:
        for path in list(_LIVE_SPILLS):
            shutil.rmtree(path, ignore_errors=True)
        _LIVE_SPILLS.clear()
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL if previous is None else previous)
    os.kill(os.getpid(), signum)
