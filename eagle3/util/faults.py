"""Named fault points for the crash tests: ``EAGLE3_FAULT=<point>[@<n>][:<action>]``.

Code calls ``fault("<point>")`` where a crash or a full disk must be survivable. Unset (every
normal run) that is one environment lookup. Set, the n-th call at that point in this process
(default: the first) either SIGKILLs the process (``kill``, the default: no cleanup, no
``finally``, no atexit, as the OOM killer or a lost node) or raises ``OSError(ENOSPC)``
(``enospc``: the disk filled up). The points and what each test asserts: docs/faults.md.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "EAGLE3_FAULT"
POINTS = ("regen", "capture", "shard_write", "manifest_write", "checkpoint_write", "export_write", "merge")
ACTIONS = ("kill", "enospc")
_hits: dict[str, int] = {}


def parse(spec: str) -> tuple[str, int, str]:
    """``"shard_write@2:enospc"`` -> ("shard_write", 2, "enospc")."""
    head, _, action = spec.partition(":")
    point, _, nth = head.partition("@")
    action = action or "kill"
    if point not in POINTS or action not in ACTIONS or (nth and not nth.isdigit()) or nth == "0":
        raise ValueError(
            f"{ENV}={spec!r}: expected <point>[@<n>][:<action>] with point one of {POINTS}, "
            f"n >= 1 and action one of {ACTIONS}"
        )
    return point, int(nth or 1), action


def fault(point: str, path: object = None) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    want, nth, action = parse(spec)
    if point != want:
        return
    _hits[spec] = _hits.get(spec, 0) + 1
    if _hits[spec] != nth:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path if path is not None else point))


def reset() -> None:
    """Forget the calls counted so far (a test that injects the same fault twice in one process)."""
    _hits.clear()
