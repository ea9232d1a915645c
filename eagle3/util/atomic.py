"""Atomic writes: a file or a directory appears whole under its final name, or not at all.

Every writer builds the result under a temp name beside the final one (same directory, so
the same filesystem), fsyncs it, and renames it into place; the parent directory is fsynced
so the rename itself survives a power cut. A process killed at any point leaves the previous
version or the new one, plus at most a temp whose name holds ``TMP_MARK``, the writer's pid and
where that pid means something (a token of the kernel's boot id and the PID namespace):
``remove_stale_temps`` clears those of processes dead in this namespace, and those written from
another machine or container only once nothing in them has changed for ``FOREIGN_STALE_S`` (on
shared storage a pid says nothing about a writer elsewhere). The dataset writer clears them all,
holding its lock.

Each commit passes a named fault point (``eagle3.util.faults``) just before its rename: the crash
tests kill the process there, or fail the write as a full disk would.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eagle3.util.faults import fault

TMP_MARK = ".tmp-"  # every temp file's or directory's name contains this, then the writer's pid
_PID_AFTER_MARK = re.compile(re.escape(TMP_MARK) + r"(\d+)")
# what follows the pid in a temp's name: "-<where>-<random>" (where: the namespace token) or, in a
# temp of an earlier layout, "-<random>" alone
_WHERE_AFTER_PID = re.compile(re.escape(TMP_MARK) + r"\d+-([0-9a-f]{8})-(?:[0-9a-f]{8}|old)")
FOREIGN_STALE_S = 30 * 60.0  # a temp from another machine or container, unchanged this long, is gone


@functools.cache
def namespace_token() -> str:
    """8 hex digits naming where this process's pids mean something: the kernel's boot id and
    the PID namespace (two containers with one host name, or two machines on shared storage,
    get different tokens)."""
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(Path(path).read_text().strip() if "boot_id" in path else str(os.stat(path).st_ino))
        except OSError:
            parts.append("")
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:8]


def temp_path(final: Path) -> Path:
    """``<name>.tmp-<pid>-<where>-<random>``: beside ``final``; two writers of one file (jobs of a
    sweep on two nodes of a shared filesystem may have the same pid) never share a temp, and
    ``where`` (``namespace_token``) says in which namespace the pid is to be looked up."""
    final = Path(final)
    return final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}-{namespace_token()}-{secrets.token_hex(4)}")


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
        old = final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}-{namespace_token()}-old")
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
            if old.name.startswith(final.name + TMP_MARK) and old.name.endswith("-old") and writer_gone(old):
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


def _last_change(path: Path) -> float:
    """The newest mtime of a temp file, or of a temp directory and what lies directly in it."""
    try:
        times = [path.lstat().st_mtime]
        if path.is_dir() and not path.is_symlink():
            times += [c.lstat().st_mtime for c in path.iterdir()]
    except OSError:
        return 0.0
    return max(times)


def writer_gone(path: Path) -> bool:
    """Whether the process that wrote the temp ``path`` is gone: dead in this namespace where its
    name says it was written here (or is of the earlier layout, which says nothing), else
    unchanged for ``FOREIGN_STALE_S``. A name without a pid is no temp of ours: never gone."""
    m = _PID_AFTER_MARK.search(path.name)
    if m is None:
        return False
    pid = int(m.group(1))
    where = _WHERE_AFTER_PID.search(path.name)
    if where is not None and where.group(1) != namespace_token():
        return time.time() - _last_change(path) > FOREIGN_STALE_S
    return pid != os.getpid() and not pid_alive(pid)


def remove_stale_temps(directory: str | Path, name: str | None = None) -> list[str]:
    """Delete the temps in ``directory`` (of ``name`` only, when given) whose writer is gone
    (``writer_gone``); returns their names."""
    removed: list[str] = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for p in sorted(directory.iterdir()):
        if TMP_MARK not in p.name or (name is not None and not p.name.startswith(name + TMP_MARK)):
            continue
        if not writer_gone(p):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p.name)
    return removed
