"""Temps on shared storage: a temp names the namespace its writer's pid belongs to, so a process
elsewhere (another machine on the same filesystem, another container with the same host name and
its own PID namespace) never deletes a live temp because that pid is not running *here*."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from eagle3.util import atomic
from eagle3.util.atomic import FOREIGN_STALE_S, TMP_MARK, namespace_token, remove_stale_temps, temp_path


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_temp_names_where_its_pid_means_something(tmp_path):
    t = temp_path(tmp_path / "shard.safetensors")
    assert t.name.startswith(f"shard.safetensors{TMP_MARK}{os.getpid()}-{namespace_token()}-")
    assert len(namespace_token()) == 8 and namespace_token() == namespace_token()


def test_only_temps_of_writers_gone_are_removed(tmp_path):
    dead, here, elsewhere = _dead_pid(), namespace_token(), "0123abcd"
    assert elsewhere != here
    names = {
        "dead_here": f"a{TMP_MARK}{dead}-{here}-00000001",  # its writer died in this namespace
        "live_here": f"a{TMP_MARK}{os.getppid()}-{here}-00000002",  # its writer runs here
        "elsewhere_live": f"a{TMP_MARK}{dead}-{elsewhere}-00000003",  # written elsewhere, still changing
        "elsewhere_stale": f"a{TMP_MARK}{dead}-{elsewhere}-00000004",  # written elsewhere, silent 31 min
        "earlier_layout_dead": f"a{TMP_MARK}{dead}-00000005",  # a temp named before the token: pid alone
        "elsewhere_dir_live": f"b{TMP_MARK}{dead}-{elsewhere}-00000006",  # a directory filled elsewhere
    }
    for key, name in names.items():
        if "dir" in key:
            (tmp_path / name).mkdir()
            (tmp_path / name / "part").write_bytes(b"x")
        else:
            (tmp_path / name).write_bytes(b"partial")
    old = time.time() - FOREIGN_STALE_S - 60
    os.utime(tmp_path / names["elsewhere_stale"], (old, old))
    os.utime(tmp_path / names["elsewhere_dir_live"], (old, old))  # the dir is old, what it holds is not
    removed = set(remove_stale_temps(tmp_path))
    assert removed == {names["dead_here"], names["elsewhere_stale"], names["earlier_layout_dead"]}
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {names["live_here"], names["elsewhere_live"], names["elsewhere_dir_live"]}


def test_an_interrupted_directory_swap_is_put_back_only_when_its_writer_is_gone(tmp_path):
    final = tmp_path / "export"
    elsewhere = tmp_path / f"export{TMP_MARK}{_dead_pid()}-0123abcd-old"  # a live swap on another machine
    elsewhere.mkdir()
    with atomic.atomic_dir(final) as tmp:
        (tmp / "config.json").write_text("{}")
    assert elsewhere.is_dir() and (final / "config.json").is_file()  # not taken for a crashed swap of ours
