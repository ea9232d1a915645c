"""Lock ownership that survives PID namespaces and shared storage (issue 48): a lock is taken
over only when its holder is provably dead in this PID namespace of this kernel, or has sent no
heartbeat for ``owner.STALE_S``. A holder recorded from another container (another PID
namespace, same host name) or another machine (another boot id) with a live heartbeat is
waited for, never taken over; the same record with a stale heartbeat is taken over with a
message. The lock file stands locked by this test (its own descriptor), as a holder elsewhere
holds it, and the record is written as that holder would have."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT

from eagle3.util import owner
from eagle3.util.locks import DirLock, LockHeldError


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def held(tmp_path):
    """A lock file flock'd by a descriptor of this test; ``write(record, age_s)`` puts a holder's
    record in it with its heartbeat ``age_s`` old."""
    path = tmp_path / ".lock"
    f = open(path, "w")
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write(record: dict, age_s: float = 0.0) -> dict:
        f.seek(0)
        f.truncate()
        f.write(json.dumps(record))
        f.flush()
        t = time.time() - age_s
        os.utime(path, (t, t))
        return record

    yield path, write
    f.close()


def _record(**changes) -> dict:
    # the holder as our own code writes it, then changed: same host name, a pid free here
    return {**owner.identity(), "pid": _dead_pid(), "started": time.time(), "command": "extract.py", **changes}


STALE = owner.STALE_S + 60


@pytest.mark.parametrize("where", ["another PID namespace", "another machine"])
def test_a_holder_elsewhere_with_a_live_heartbeat_is_not_taken_over(held, where):
    path, write = held
    elsewhere = {"pid_ns": owner.pid_namespace() + 1} if where == "another PID namespace" else {"boot_id": "0" * 36}
    record = write(_record(**elsewhere), age_s=60)  # its pid is free here, which says nothing about it
    with pytest.raises(LockHeldError, match=f"is held by pid {record['pid']} on host {socket.gethostname()}"):
        DirLock(path, "a test").acquire()
    assert json.loads(path.read_text()) == record  # its record untouched, its lock file the same


@pytest.mark.parametrize("where", ["another PID namespace", "another machine"])
def test_a_holder_elsewhere_whose_heartbeat_stopped_is_taken_over_with_a_message(held, where, capsys):
    path, write = held
    elsewhere = {"pid_ns": owner.pid_namespace() + 1} if where == "another PID namespace" else {"boot_id": "0" * 36}
    record = write(_record(**elsewhere), age_s=STALE)
    with DirLock(path, "a test"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert f"taking over {path} (a test): its holder, pid {record['pid']}" in err and "no heartbeat for" in err


def test_a_holder_dead_in_this_namespace_is_taken_over_at_once(held, capsys):
    path, write = held
    record = write(_record(), age_s=0)
    with DirLock(path, "a test"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"pid {record['pid']} is no longer running in this PID namespace" in capsys.readouterr().err


def test_a_holder_whose_pid_now_names_another_process_is_taken_over(held):
    path, write = held
    parent = os.getppid()  # alive, but started at another time than the record says
    write(_record(pid=parent, start_ticks=owner.start_ticks(parent) + 1), age_s=0)
    with DirLock(path, "a test"):
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_record_without_identity_is_taken_over_only_when_silent(held):
    path, write = held
    legacy = {"pid": _dead_pid(), "host": socket.gethostname(), "started": time.time()}  # an older writer's
    write(legacy, age_s=60)
    with pytest.raises(LockHeldError):
        DirLock(path, "a test").acquire()
    write(legacy, age_s=STALE)
    with DirLock(path, "a test"):
        pass


# a holder in "another PID namespace" (its namespace reported as another), heartbeat every 0.2 s
FOREIGN_HOLDER = textwrap.dedent("""
    import sys, time
    from eagle3.util import owner
    from eagle3.util.locks import DirLock
    ns = owner.pid_namespace() + 1
    owner.pid_namespace = lambda: ns
    owner.HEARTBEAT_S = 0.2
    lock = DirLock(sys.argv[1], "a foreign holder").acquire()
    print("held", flush=True)
    time.sleep(120)
""")


def test_a_holder_that_keeps_its_heartbeat_is_never_taken_over(tmp_path):
    path = tmp_path / ".lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", FOREIGN_HOLDER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        old = time.time() - STALE
        os.utime(path, (old, old))  # as if silent for longer than the limit ...
        time.sleep(1.0)  # ... until its next heartbeat
        assert owner.heartbeat_age(path) < 5
        with pytest.raises(LockHeldError, match=f"held by pid {proc.pid}"):
            DirLock(path, "a test").acquire()
        assert json.loads(path.read_text())["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait(30)


def test_start_ticks_tell_processes_apart():
    assert owner.start_ticks(os.getpid()) == owner.start_ticks(os.getpid()) is not None
    assert owner.start_ticks(_dead_pid()) is None
    me = owner.identity()
    assert not owner.provably_dead(me) and owner.provably_dead({**me, "pid": _dead_pid()})
    assert not owner.provably_dead({**me, "pid": _dead_pid(), "pid_ns": None})  # no identity: never provable


# a holder here that prints once it holds, then sleeps (it is stopped by the test)
HOLDER_HERE = textwrap.dedent("""
    import sys, time
    from eagle3.util.locks import DirLock
    lock = DirLock(sys.argv[1], "a holder to stop").acquire()
    print("held", flush=True)
    time.sleep(120)
""")


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] in "Tt"


def test_a_stopped_holder_here_is_never_taken_over_on_heartbeat_age(tmp_path, monkeypatch):
    path = tmp_path / ".lock"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_HERE, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        inode = path.stat().st_ino
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        monkeypatch.setattr(owner, "STALE_S", 0.5)  # its heartbeat long past the limit ...
        old = time.time() - 60
        os.utime(path, (old, old))
        with pytest.raises(LockHeldError, match=rf"pid {proc.pid} .*is stopped.*kill -CONT {proc.pid}.* or end it"):
            DirLock(path, "a test").acquire()  # ... yet it is alive here: refused
        assert path.stat().st_ino == inode and json.loads(path.read_text())["pid"] == proc.pid
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(30)


def test_a_stopped_capture_here_keeps_its_spill_dir_whatever_its_heartbeat(tmp_path, monkeypatch):
    from eagle3.target_model.spill_dirs import OWNER_FILE, remove_stale_spill_dirs

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        spill = tmp_path / f"eagle3-vllm-capture-{proc.pid}@{socket.gethostname()}-x"
        spill.mkdir()
        owner.write_record(spill / OWNER_FILE, {**owner.identity(proc.pid)})
        old = time.time() - 60
        os.utime(spill / OWNER_FILE, (old, old))
        monkeypatch.setattr(owner, "STALE_S", 0.5)
        assert remove_stale_spill_dirs(tmp_path) == [] and spill.is_dir()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(30)


def test_a_holder_elsewhere_taken_over_while_stopped_fails_loudly_once_resumed(tmp_path, monkeypatch):
    path = tmp_path / ".lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", FOREIGN_HOLDER, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        os.kill(proc.pid, signal.SIGSTOP)
        monkeypatch.setattr(owner, "STALE_S", 0.5)  # its liveness cannot be checked from here: its heartbeat rules
        old = time.time() - 60
        os.utime(path, (old, old))
        with DirLock(path, "a test"):
            os.kill(proc.pid, signal.SIGCONT)
            rc = proc.wait(30)  # its heartbeat finds the lock file is no longer its own
            assert json.loads(path.read_text())["pid"] == os.getpid()
        err = proc.stderr.read()
        assert rc != 0 and f"lost its lock {path}" in err and "another process took it over" in err, err
    finally:
        os.kill(proc.pid, signal.SIGCONT) if proc.poll() is None else None
        proc.kill()
        proc.wait(30)
