"""A JSONL cache (the self-prompts, the regenerated answers) is appended under a lock and fsynced:
two extractions of one config appending at once used to interleave their lines (a write is split
past the buffer's size), and a crash could lose lines the run had counted as cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from eagle3.util.append_lines import append_lines
from eagle3.util.locks import LockHeldError

HOLD = textwrap.dedent("""
    import sys, time
    from eagle3.util.locks import DirLock
    lock = DirLock(sys.argv[1], "another extraction appending").acquire()
    print("held", flush=True)
    time.sleep(60)
""")


def test_an_append_waits_for_the_lock_and_names_its_holder(tmp_path, monkeypatch):
    cache = tmp_path / "cache.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, f"{cache}.lock"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        monkeypatch.setenv("EAGLE3_LOCK_WAIT_S", "0.5")
        with pytest.raises(LockHeldError, match=f"held by pid {proc.pid}"):
            append_lines(cache, [json.dumps({"index": 0, "text": "a"})], "the self-prompt cache")
        assert not cache.exists()
    finally:
        proc.kill()
        proc.wait(30)
    append_lines(cache, [json.dumps({"index": 0, "text": "a"})], "the self-prompt cache")  # free now
    assert cache.read_text() == '{"index": 0, "text": "a"}\n'


def test_an_append_is_fsynced_whole(tmp_path, monkeypatch):
    cache = tmp_path / "cache.jsonl"
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    big = ["x" * 20_000, "y" * 20_000]  # past any write buffer: one write of the whole
    append_lines(cache, big, "a cache")
    append_lines(cache, ["z"], "a cache")
    assert cache.read_text().splitlines() == [*big, "z"]
    assert synced.count(str(cache)) == 2
