"""Ending this process's descendants: what a capture or an evaluation engine does before it goes,
so that vLLM's engine core and workers never outlive the process that started them."""

from __future__ import annotations


def end_descendants(grace_s: float = 10.0) -> None:
    """SIGTERM to every descendant of this process (vLLM's engine core and workers each shut down
    on it), then SIGKILL to those still there after ``grace_s``."""
    import psutil  # type: ignore[import-untyped]  # a vLLM dependency, without type stubs

    children = psutil.Process().children(recursive=True)
    for c in children:
        try:
            c.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for c in alive:
        try:
            c.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
