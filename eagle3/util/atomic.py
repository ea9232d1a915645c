"""Atomic writes: a file or a directory appears whole under its final name, or not at all.

Every writer builds the result under a temp name beside the final one (same directory, so
the same filesystem), fsyncs it, and renames it into place; the parent directory is fsynced
so the rename itself survives a power cut. A process killed at any point leaves the previous
version or the new one, plus at most a temp whose name holds ``TMP_MARK`` and the writer's
pid: ``remove_stale_temps`` clears those of dead processes (the dataset writer clears all of
them, holding its lock).

Each commit passes a named fault point (``eagle3.util.faults``) just before its rename: the crash
tests kill the process there, or fail the write as a full disk would.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eagle3.util.faults import fault

TMP_MARK = ".tmp-"  # every temp file's or directory's name contains this, then the writer's pid
_PID_AFTER_MARK = re.compile(re.escape(TMP_MARK) + r"(\d+)")


def temp_path(final: Path) -> Path:
    """``<name>.tmp-<pid>-<random>``: beside ``final``; two writers of one file (jobs of a sweep on
    two nodes of a shared filesystem may have the same pid) never share a temp."""
    final = Path(final)
    return final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def commit(tmp: Path, final: Path, point: str | None = None) -> None:
    """fsync a finished temp file and rename it over ``final`` (atomic on POSIX)."""
    _fsync_file(tmp)
    if point:
        fault(point, final)
    os.replace(tmp, final)
    fsync_dir(Path(final).parent)


@contextmanager
def atomic_path(final: str | Path, point: str | None = None) -> Iterator[Path]:
    """``with atomic_path(final) as tmp:`` write the file ``tmp``; on leaving the block it is
    committed as ``final``. An exception (a full disk included) removes ``tmp`` and leaves
    ``final`` as it was."""
    final = Path(final)
    tmp = temp_path(final)
    try:
        yield tmp
        commit(tmp, final, point)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(final: str | Path, data: bytes, point: str | None = None) -> None:
    with atomic_path(final, point) as tmp:
        tmp.write_bytes(data)


def write_text(final: str | Path, text: str, point: str | None = None) -> None:
    write_bytes(final, text.encode(), point)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the kernel,
    libc or filesystem cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(tmp: Path, final: Path, point: str | None = None) -> None:
    """Put the finished directory ``tmp`` in place of ``final`` (which may exist).

    Its files are fsynced first. An existing ``final`` is swapped out in one step where the
    kernel can (then deleted); elsewhere it is renamed aside first, so a kill between the two
    renames leaves it whole under a temp name and no ``final``."""
    tmp, final = Path(tmp), Path(final)
    for p in sorted(tmp.rglob("*")):
        if p.is_file() and not p.is_symlink():
            _fsync_file(p)
    fsync_dir(tmp)
    if point:
        fault(point, final)
    if not final.exists():
        os.rename(tmp, final)
    elif _exchange(tmp, final):
        shutil.rmtree(tmp)  # now the previous version
    else:
        old = final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}-old")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    fsync_dir(final.parent)


@contextmanager
def atomic_dir(final: str | Path, point: str | None = None) -> Iterator[Path]:
    """``with atomic_dir(final) as tmp:`` fill the fresh directory ``tmp``; on leaving the
    block it replaces ``final`` (``replace_dir``). An exception removes ``tmp``."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if not final.exists():  # killed between replace_dir's two renames: the previous one is whole
        for old in sorted(final.parent.iterdir()):
            if (
                old.name.startswith(final.name + TMP_MARK)
                and old.name.endswith("-old")
                and (m := _PID_AFTER_MARK.search(old.name)) is not None  # a name without a pid is no temp of ours
                and not pid_alive(int(m.group(1)))
            ):
                os.rename(old, final)
                break
    remove_stale_temps(final.parent, final.name)
    tmp = temp_path(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, final, point)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temps(directory: str | Path, name: str | None = None) -> list[str]:
    """Delete the temps in ``directory`` (of ``name`` only, when given) whose writer pid is no
    longer running on this host; returns their names."""
    removed: list[str] = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for p in sorted(directory.iterdir()):
        m = _PID_AFTER_MARK.search(p.name)
        if m is None or (name is not None and not p.name.startswith(name + TMP_MARK)):
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or pid_alive(pid):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p.name)
    return removed
