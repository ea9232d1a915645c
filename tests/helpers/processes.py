"""What the tests of processes left behind share (tests/integration/vllm/test_left_running.py,
tests/integration/test_left_behind.py): a real vLLM capture to kill, whether a process is gone, waiting for a
condition with a deadline, ending what a test started when it fails part-way; the loader's
read-ahead threads still running."""

from __future__ import annotations

import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Iterable

import psutil

# a real capture: SmolLM2 through vLLM, one sample captured, then waiting with its engine up
VLLM_CAPTURE = textwrap.dedent("""
    import sys, time, torch
    from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend
    engine = CaptureEngine(max_model_len=256, max_num_seqs=2, cpu_kvcache_space_gb=1, enforce_eager=True)
    backend = VLLMCaptureBackend(sys.argv[1], (2, 15, 27, 30), engine=engine, spill_dir=sys.argv[2])
    ids = torch.arange(1, 20)
    assert len(list(backend.capture([("s0", ids, torch.ones_like(ids, dtype=torch.bool))]))) == 1
    print("SPILL", backend._dirs.spill, flush=True)  # vLLM logs to stdout too
    time.sleep(600)
""")


def gone(process: psutil.Process | int) -> bool:
    """Ended (or a zombie): a ``psutil.Process`` seen earlier (its pid reused by another process
    counts as gone), or a pid."""
    try:
        p = process if isinstance(process, psutil.Process) else psutil.Process(process)
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Whether ``predicate()`` became true within ``timeout`` seconds (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def kill_all(proc: subprocess.Popen, processes: Iterable[psutil.Process]) -> None:
    """SIGKILL ``proc`` and those of ``processes`` still running (a test's clean-up)."""
    proc.kill()
    proc.wait(30)
    for p in processes:
        if not gone(p):
            p.kill()


def read_ahead_threads() -> list[threading.Thread]:
    """The loader's read-ahead threads (eagle3/store/read_ahead.py) running in this process."""
    return [t for t in threading.enumerate() if t.name == "eagle3-read-ahead"]
