"""Kills leave nothing behind, with real processes and real signals: the evaluation's engine
(a session of its own) ends when the process that started it is killed by SIGTERM or SIGKILL,
taking the processes it started with it; the /dev/shm spill directories of vLLM capture are
removed on SIGTERM and found and removed by the next run after a SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import ROOT

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
    from eagle3.evaluation.engine import EngineRequest
    from eagle3.evaluation.subprocess_engine import run_engine_process
    request = EngineRequest(model="none", head=None, num_draft_tokens=1, max_new_tokens=1, max_model_len=16,
                            batches=[], options=EngineOptions(timeout_s=600))
    run_engine_process(request, Path(sys.argv[1]), "dummy", command=[sys.executable, "-c", sys.argv[2]])
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout:.0f} s: {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killing_the_caller_ends_the_evaluation_engine_and_its_processes(tmp_path, sig):
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path), DUMMY_ENGINE], cwd=ROOT)
    pids = tmp_path / "engine-dummy.request.json.pids"
    engine = grandchild = None
    try:
        _wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, 120, "the engine did not start")
        engine, grandchild = (int(x) for x in pids.read_text().split())
        assert psutil.Process(engine).ppid() == caller.pid and not _gone(grandchild)
        caller.send_signal(sig)
        assert caller.wait(60) == -sig  # the caller dies of the signal, as it would have
        _wait_for(lambda: _gone(engine) and _gone(grandchild), 30, "the engine or its child outlived the caller")
    finally:
        caller.kill()
        for pid in (engine, grandchild):
            if pid is not None and not _gone(pid):
                psutil.Process(pid).kill()
