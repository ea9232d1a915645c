"""Ending this process's descendants: what a capture or an evaluation engine does before it goes,
so that vLLM's engine core and workers never outlive the process that started them.

A process killed by SIGKILL (or the OOM killer) runs no code, so its own cleanup cannot end them:
``start_reaper`` starts a small watcher process first (a session of its own, so a signal to the
caller's process group leaves it), which notes the caller's new descendants as they appear and,
once the caller is gone (its parent pid changes), ends them (SIGTERM, then SIGKILL after
``REAP_GRACE_S``) and removes the paths it was given. ``Reaper.stop()`` ends the watcher when
the caller closes the work itself.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REAP_POLL_S = 0.25  # how often the reaper looks for new descendants and for its caller
REAP_GRACE_S = 3.0  # SIGTERM first (vLLM's engine core shuts down on it), SIGKILL after this
_ROOT = str(Path(__file__).resolve().parents[2])  # the checkout holding eagle3/, for the reaper's import


def end_descendants(grace_s: float = 10.0) -> None:
    """SIGTERM to every descendant of this process (vLLM's engine core and workers each shut down
    on it), then SIGKILL to those still there after ``grace_s``."""
    import psutil  # type: ignore[import-untyped]  # a vLLM dependency, without type stubs

    _end(psutil.Process().children(recursive=True), grace_s)


def _end(processes: list, grace_s: float) -> list:
    """SIGTERM to ``processes``, SIGKILL to those left after ``grace_s``; returns those it signalled."""
    import psutil

    signalled = []
    for p in processes:
        try:
            p.terminate()  # psutil checks the pid still names the process it saw (no reused pid)
            signalled.append(p)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(signalled, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return signalled


class Reaper:
    """The watcher of ``start_reaper``; ``stop()`` once the work is closed the ordinary way."""

    def __init__(self, proc: subprocess.Popen | None):
        self.proc = proc

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write("stop\n")
            proc.stdin.close()
            proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(10)


def start_reaper(remove: Sequence[str | os.PathLike] = ()) -> Reaper:
    """A watcher that, should this process die before ``Reaper.stop()``, ends the processes this
    process starts from now on (and theirs) and removes ``remove``. Returns once it watches."""
    import psutil

    existing = [c.pid for c in psutil.Process().children(recursive=True)]  # not ours to end
    spec = json.dumps({"parent": os.getpid(), "skip": existing, "remove": [str(p) for p in remove]})
    code = f"import sys; sys.path.insert(0, {_ROOT!r}); from eagle3.util.processes import reap_main; reap_main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip()
    proc.stdout.close()
    if ready != "ready":
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"eagle3: the reaper of this process's children did not start (exit {proc.poll()})")
    return Reaper(proc)


def reap_main() -> None:
    """The reaper process: ``python -c ... '{"parent": pid, "skip": [...], "remove": [...]}'``."""
    import psutil

    spec = json.loads(sys.argv[1])
    parent, skip = int(spec["parent"]), set(spec["skip"]) | {os.getpid()}
    seen: dict[int, psutil.Process] = {}

    def note_descendants() -> None:
        try:
            for c in psutil.Process(parent).children(recursive=True):
                if c.pid not in skip:
                    seen.setdefault(c.pid, c)
        except psutil.Error:
            pass

    note_descendants()
    print("ready", flush=True)
    stdin_open = True
    while os.getppid() == parent:
        if stdin_open and select.select([sys.stdin], [], [], REAP_POLL_S)[0]:
            line = sys.stdin.readline()
            if line.strip() == "stop":
                return
            stdin_open = line != ""  # end of file: every holder of the pipe is gone
        elif not stdin_open:
            time.sleep(REAP_POLL_S)
        note_descendants()
    _reap(list(seen.values()), spec["remove"], parent)


def _reap(noted: list, remove: list[str], parent: int) -> None:
    import psutil

    left = [p for p in noted if p.is_running()]
    for p in list(left):
        try:
            left += [c for c in p.children(recursive=True) if c not in left]
        except psutil.Error:
            pass
    ended = _end(left, REAP_GRACE_S)
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)
    print(
        f"[eagle3] process {parent} is gone; ended {len(ended)} process(es) it started "
        f"({', '.join(str(p.pid) for p in ended) or 'none left'}) and removed {', '.join(remove) or 'nothing'}",
        file=sys.stderr,
        flush=True,
    )
