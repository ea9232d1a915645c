"""Kills leave nothing behind, with real processes and real signals: the evaluation's engine
(a session of its own) ends when the process that started it is killed by SIGTERM or SIGKILL,
taking the processes it started with it; the /dev/shm spill directories of vLLM capture are
removed on SIGTERM and found and removed by the next run after a SIGKILL (a real vLLM capture
killed: test_left_running.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest
from conftest import ROOT
from helpers.processes import gone, wait_for

# stands in for `python -m eagle3.evaluation.engine`: watches its parent as the engine does,
# and starts a process of its own as vLLM starts its engine core
DUMMY_ENGINE = textwrap.dedent("""
    import os, subprocess, sys, time
    from pathlib import Path
    from eagle3.evaluation.engine import watch_parent
    watch_parent()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path(sys.argv[-2] + ".pids").write_text(f"{os.getpid()} {child.pid}")
    time.sleep(300)
""")

# train.py / evaluate.py at the point where they wait for the engine
CALLER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from eagle3.config.engine import EngineOptions
    from eagle3.evaluation.engine_io import EngineRequest
    from eagle3.evaluation.subprocess_engine import run_engine_process
    request = EngineRequest(model="none", head=None, num_draft_tokens=1, max_new_tokens=1, max_model_len=16,
                            batches=[], options=EngineOptions(timeout_s=600))
    run_engine_process(request, Path(sys.argv[1]), "dummy", command=[sys.executable, "-c", sys.argv[2]])
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killing_the_caller_ends_the_evaluation_engine_and_its_processes(tmp_path, sig):
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path), DUMMY_ENGINE], cwd=ROOT)
    pids = tmp_path / "engine-dummy.request.json.pids"
    engine = grandchild = None
    try:
        started = wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, 120)
        assert started, "after 120 s: the engine did not start"
        engine, grandchild = (int(x) for x in pids.read_text().split())
        assert psutil.Process(engine).ppid() == caller.pid and not gone(grandchild)
        caller.send_signal(sig)
        assert caller.wait(60) == -sig  # the caller dies of the signal, as it would have
        ended = wait_for(lambda: gone(engine) and gone(grandchild), 30)
        assert ended, "after 30 s: the engine or its child outlived the caller"
    finally:
        caller.kill()
        for pid in (engine, grandchild):
            if pid is not None and not gone(pid):
                psutil.Process(pid).kill()


# ---------------------------------------------------------------- vLLM capture's spill directories

# a capture process at the point where it holds its spill directory: made the backend's way
SPILL_OWNER = textwrap.dedent("""
    import os, sys, time
    from eagle3.target_model.spill_dirs import make_spill_dir
    path = make_spill_dir(sys.argv[1])
    open(os.path.join(path, "req-1.safetensors"), "wb").write(b"x" * 4096)  # a file in flight
    print(path, flush=True)
    time.sleep(300)
""")


def _spill_owner(parent) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SPILL_OWNER, str(parent)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    return proc, proc.stdout.readline().strip()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_killed_captures_spill_dir_is_removed_by_it_or_by_the_next_capture(tmp_path, sig):
    from eagle3.target_model.spill_dirs import SPILL_PREFIX, make_spill_dir, release_spill_dir

    killed, path = _spill_owner(tmp_path)
    live, live_path = _spill_owner(tmp_path)  # another capture, still running
    try:
        assert os.path.isdir(path) and f"{SPILL_PREFIX}{killed.pid}@" in path
        killed.send_signal(sig)
        assert killed.wait(30) == -sig
        if sig == signal.SIGTERM:
            assert not os.path.exists(path)  # its handler removed it, then SIGTERM ended it
        else:
            assert os.path.isdir(path)  # nothing ran: the next capture finds it
        mine = make_spill_dir(str(tmp_path))  # what the next VLLMCaptureBackend does first
        assert not os.path.exists(path) and os.path.isdir(live_path)  # the live one is kept
        release_spill_dir(mine)
    finally:
        for p in (killed, live):
            p.kill()
            p.wait(30)


def test_only_spill_dirs_of_dead_processes_of_this_host_are_removed(tmp_path):
    from eagle3.target_model.spill_dirs import SPILL_PREFIX, remove_stale_spill_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is free now
    host = socket.gethostname()
    made = {
        "dead": tmp_path / f"{SPILL_PREFIX}{dead.pid}@{host}-ab_c12",
        "alive": tmp_path / f"{SPILL_PREFIX}{os.getppid()}@{host}-xyz9",
        "other host": tmp_path / f"{SPILL_PREFIX}{dead.pid}@not-{host}-q1w2",
        "no pid (older name)": tmp_path / f"{SPILL_PREFIX}k3j4h5",
        "someone else's": tmp_path / f"other-{dead.pid}@{host}-abc",
    }
    for d in made.values():
        d.mkdir()
        (d / "f.safetensors").write_bytes(b"x")
    symlink = tmp_path / f"{SPILL_PREFIX}{dead.pid}@{host}-link"
    symlink.symlink_to(made["someone else's"])
    assert remove_stale_spill_dirs(tmp_path) == [str(made["dead"])]
    assert [k for k, d in made.items() if not d.exists()] == ["dead"] and symlink.is_symlink()
    assert remove_stale_spill_dirs(tmp_path / "absent") == []
