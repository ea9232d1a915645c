"""The spill directories of a vLLM capture: where vLLM's connector writes one file per request
until eagle3/target_model/capture_vllm.py reads it back. Files there are transient, but a capture
killed part-way must not leave gigabytes in /dev/shm (memory) behind it.

A directory is named by its owner (``eagle3-vllm-capture-<pid>@<host>-<random>``), holds the
owner's record (``.owner.json``: boot id, PID namespace, start time; eagle3/util/owner.py) whose
mtime the owner refreshes while it lives, and is removed on release, on SIGTERM (a handler ends
vLLM's processes, removes it, then lets the signal end the process as it would have), after a
SIGKILL or the OOM killer by the capture's reaper (eagle3/util/processes.py), and failing that by
the next capture: ``make_spill_dir`` removes the directories whose owner is provably dead in this
PID namespace, or silent for ``owner.STALE_S``. A directory of a live capture in another container
sharing /dev/shm (same host name, its own PID namespace) or of another machine sharing the
``spill_dir`` is left alone. The directory appears under its name only with its record in it.
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

from eagle3.util import owner
from eagle3.util.atomic import pid_alive
from eagle3.util.processes import end_descendants

SHM_DIR = "/dev/shm"
SHM_MIN_FREE = 8 * 2**30  # /dev/shm is used for spill files only with this much room
SPILL_PREFIX = "eagle3-vllm-capture-"
OWNER_FILE = ".owner.json"  # the owner's record; its mtime is the owner's heartbeat
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
    """Remove the spill directories in ``parent`` left by captures that are gone (SIGKILL, OOM):
    provably dead in this PID namespace, or silent for ``owner.STALE_S``; returns their paths.
    Directories of live captures, here or elsewhere, and anything not named by ``make_spill_dir``
    are left alone. A directory without a record (an older writer's) goes by the old rule: its
    owner pid, on this host, is not running."""
    host, removed = socket.gethostname(), []
    try:
        entries = list(os.scandir(str(parent)))
    except OSError:
        return []
    for entry in entries:
        m = _SPILL_NAME.match(entry.name)
        if m is None or not entry.is_dir(follow_symlinks=False):
            continue
        record = owner.read_record(os.path.join(entry.path, OWNER_FILE))
        if record is None:
            pid = int(m.group(1))
            if m.group(2) != host or pid == os.getpid() or pid_alive(pid):
                continue
        elif owner.gone_because(record, os.path.join(entry.path, OWNER_FILE)) is None:
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
    # made under a hidden name, named once its record is in it: a cleanup never sees it without one
    tmp = tempfile.mkdtemp(prefix=f".{SPILL_PREFIX}{os.getpid()}@{socket.gethostname()}-", dir=parent)
    owner.write_record(os.path.join(tmp, OWNER_FILE))
    path = os.path.join(os.path.dirname(tmp), os.path.basename(tmp)[1:])
    os.rename(tmp, path)
    _LIVE_SPILLS[path] = owner.Heartbeat(os.path.join(path, OWNER_FILE), owner.HEARTBEAT_S)
    _install_sigterm_cleanup()
    return path


IPC_PREFIX = "eagle3-vllm-ipc-"
# a unix socket's path holds at most 107 bytes, and vLLM names each of its sockets <dir>/<uuid4>
IPC_DIR_MAX = 107 - 1 - 36


def make_ipc_dir() -> str:
    """A new directory in the system temp dir for one engine's ZMQ sockets (vLLM's
    ``VLLM_RPC_BASE_PATH``, by default the temp dir itself, where sockets of killed engines pile
    up); removed by ``release_spill_dir`` and on SIGTERM, as a spill directory is."""
    parent = tempfile.gettempdir()
    if len(os.path.join(parent, IPC_PREFIX + "x" * 8)) > IPC_DIR_MAX:
        raise OSError(
            f"temp dir {parent}: expected a path of at most {IPC_DIR_MAX - len(IPC_PREFIX) - 9} characters "
            f"(vLLM's IPC sockets go there, and a socket path holds 107), got {len(parent)}; "
            "set TMPDIR to a shorter directory"
        )
    path = tempfile.mkdtemp(prefix=IPC_PREFIX, dir=parent)
    _LIVE_SPILLS[path] = None
    _install_sigterm_cleanup()
    return path


def release_spill_dir(path: str) -> None:
    """Remove a directory of ``make_spill_dir`` or ``make_ipc_dir`` (and, with none left, the
    SIGTERM handler)."""
    beat = _LIVE_SPILLS.pop(path, None)
    if beat is not None:
        beat.stop()
    shutil.rmtree(path, ignore_errors=True)
    if not _LIVE_SPILLS:
        _uninstall_sigterm_cleanup()


_LIVE_SPILLS: dict[str, owner.Heartbeat | None] = {}  # path -> the heartbeat of its record, if any
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
