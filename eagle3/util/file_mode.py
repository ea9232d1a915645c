"""A file's mode as the umask gives it, for files written by code that ignores the umask.

safetensors writes through a temp file of its own, created 0600, and renames it: its files are
0600 whatever the umask, where every other file of a run is 0666 less the umask (0644 under the
usual 022). A dataset's vocabulary, a target built into a shared cache or an export must be
readable by whoever the umask lets read them: ``apply_umask(path)`` right after such a write
(before the temp is renamed into place) sets the mode the umask would have given.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """This process's umask, read without changing it where /proc gives it (``Umask:`` in
    /proc/self/status), else set and restored at once under a lock."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def apply_umask(*paths: str | Path) -> None:
    """Give each regular file of ``paths`` (a directory: every regular file under it) the mode
    0666 less the umask. Symlinks are left alone."""
    mode = 0o666 & ~current_umask()
    for path in paths:
        path = Path(path)
        if path.is_dir() and not path.is_symlink():
            for root, _dirs, files in os.walk(path):
                for name in files:
                    _chmod_file(Path(root) / name, mode)
        else:
            _chmod_file(path, mode)


def _chmod_file(path: Path, mode: int) -> None:
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
