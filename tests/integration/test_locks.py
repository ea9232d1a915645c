"""Two runs at once, with real processes (a holder started here, the entrypoint's run() in
this one): a second extraction of the same dataset or a second training into the same run
dir is refused naming the holder's pid and host; a lock whose holder died on this host is
taken over, even while a forked child still holds it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT, compose
from helpers import at_most
from helpers.faults import ARGS

from eagle3.extraction.identity import dataset_path
from eagle3.stages.extract import run as extract
from eagle3.stages.narrow import dataset_identity
from eagle3.stages.train import run as train
from eagle3.store.layout import LOCK
from eagle3.target_model.resolve import resolve_target
from eagle3.training.run_dir import LOCK as TRAIN_LOCK
from eagle3.util.locks import DirLock, LockHeldError


def test_a_second_extraction_of_the_same_dataset_is_refused(tmp_path):
    cfg = compose("extract", ARGS + [f"paths.datasets_dir={tmp_path}"])
    ds = dataset_path(dataset_identity(cfg, resolve_target(cfg.model, cfg.paths.cache_dir)))
    holder = _holder(ds / LOCK, "hold", 60)  # another process is the first extraction
    try:
        pid = int(holder.stdout.readline())
        with pytest.raises(
            LockHeldError,
            match=f"another extraction is writing this dataset: .* held by pid {pid} on host {socket.gethostname()}",
        ):
            extract(cfg)
    finally:
        holder.kill()
        holder.wait(30)
    assert not list(ds.glob("shard-*")) and not (ds / "manifest.json").exists()  # it wrote nothing


def test_a_second_training_into_the_same_run_dir_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir / TRAIN_LOCK, "hold", 60)
    try:
        pid = int(holder.stdout.readline())
        with pytest.raises(
            LockHeldError,
            match=f"another training is writing the run dir .* held by pid {pid} on host {socket.gethostname()}",
        ):
            train(compose("train", ARGS + [f"paths.datasets_dir={tmp_path / 'data'}"], output_dir=str(run_dir)))
    finally:
        holder.kill()
        holder.wait(30)
    assert not (run_dir / "checkpoints").exists() and not (tmp_path / "data").exists()  # refused before any work


HOLDER = textwrap.dedent("""
    import os, signal, sys, time
    from eagle3.util.locks import DirLock
    lock = DirLock(sys.argv[1], "a test holder").acquire()
    mode = sys.argv[2]
    if mode == "fork":  # a child inherits the locked descriptor and outlives us
        child = os.fork()
        if child == 0:
            time.sleep(120)
            os._exit(0)
        print(child, flush=True)
    if mode == "hold":
        print(os.getpid(), flush=True)
        time.sleep(float(sys.argv[3]))
        sys.exit(0)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _holder(path, mode: str, seconds: float = 0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), mode, str(seconds)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )


def _recorded(path) -> dict:
    return json.loads(path.read_text())


def test_a_live_holder_is_named_and_waited_for(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path, "hold", 3)
    pid = int(proc.stdout.readline())
    with pytest.raises(LockHeldError, match=f"a test: {path} is held by pid {pid} on host {socket.gethostname()}"):
        DirLock(path, "a test").acquire()
    t0 = time.monotonic()
    with DirLock(path, "a test", wait_s=60):  # waits until the holder is done
        assert time.monotonic() - t0 > 0.5 and _recorded(path)["pid"] == os.getpid()
    assert proc.wait(30) == 0


def test_the_lock_of_a_dead_holder_is_taken_over(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path, "die")
    assert proc.wait(30) == -signal.SIGKILL
    dead = _recorded(path)["pid"]
    assert dead == proc.pid  # its record outlives it
    with DirLock(path, "a test"):
        assert _recorded(path)["pid"] == os.getpid()


def test_a_lock_kept_alive_by_an_orphaned_child_is_taken_over(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path, "fork")
    orphan = int(proc.stdout.readline())
    assert proc.wait(30) == -signal.SIGKILL
    try:
        assert _recorded(path)["pid"] == proc.pid  # dead, but its flock lives on in the child
        with DirLock(path, "a test"):
            assert _recorded(path)["pid"] == os.getpid()
            with pytest.raises(LockHeldError, match=f"held by pid {os.getpid()}"):
                DirLock(path, "a second test").acquire()  # the new lock is a real one
    finally:
        os.kill(orphan, signal.SIGKILL)


# ---------------------------------------------------------------- bounded, reported waits


def test_a_lock_wait_names_the_holder_and_gives_up_naming_it(tmp_path, capsys):
    path = tmp_path / ".lock"
    proc = _holder(path, "hold", 60)
    try:
        pid = int(proc.stdout.readline())
        t0 = time.monotonic()
        with at_most(30), pytest.raises(LockHeldError) as err:
            DirLock(path, "a test", wait_s=1.5).acquire()
        assert 1.4 < time.monotonic() - t0 < 10
        msg = str(err.value)
        assert f"a test: {path} is held by pid {pid} on host {socket.gethostname()}" in msg
        assert "gave up after waiting 2 s" in msg and "EAGLE3_LOCK_WAIT_S" in msg
        printed = capsys.readouterr().err
        assert f"waiting for {path} (a test): held by pid {pid} on host {socket.gethostname()}" in printed
        assert _recorded(path)["pid"] == pid  # the waiter never emptied the holder's record
    finally:
        proc.kill()
        proc.wait(30)


def test_the_wait_bound_is_configured_by_the_environment(monkeypatch):
    from eagle3.util.locks import DEFAULT_WAIT_S, lock_wait_s

    monkeypatch.delenv("EAGLE3_LOCK_WAIT_S", raising=False)
    assert lock_wait_s() == DEFAULT_WAIT_S == 1800
    monkeypatch.setenv("EAGLE3_LOCK_WAIT_S", "inf")
    assert lock_wait_s() == float("inf")
    monkeypatch.setenv("EAGLE3_LOCK_WAIT_S", "soon")
    with pytest.raises(ValueError, match="EAGLE3_LOCK_WAIT_S: expected seconds"):
        lock_wait_s()


def test_the_vocabulary_and_merge_waits_give_up_naming_the_holder(tmp_path, monkeypatch, capsys):
    """add_vocab waits for a running extraction, merge_parts for another merge: both print whom
    they wait for and give up after EAGLE3_LOCK_WAIT_S."""
    import torch

    from eagle3.store.merge import merge_parts
    from eagle3.store.vocab_files import add_vocab

    monkeypatch.setenv("EAGLE3_LOCK_WAIT_S", "1")
    ds = tmp_path / "ds"
    for lock_path, call in (
        (ds / LOCK, lambda: add_vocab(ds, 4, torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.bool))),
        (tmp_path / "ds.merge.lock", lambda: merge_parts(ds, 2)),
    ):
        proc = _holder(lock_path, "hold", 60)
        try:
            pid = int(proc.stdout.readline())
            with at_most(30), pytest.raises(LockHeldError, match=f"held by pid {pid} .* gave up after waiting 1 s"):
                call()
            assert f"waiting for {lock_path}" in capsys.readouterr().err
        finally:
            proc.kill()
            proc.wait(30)


def test_the_online_pre_pass_wait_gives_up_naming_the_holder(tmp_path, monkeypatch):
    from eagle3.extraction.identity import token_dataset_path, token_fingerprint_inputs
    from eagle3.extraction.tokens import prepare_token_dataset
    from eagle3.stages.narrow import regen_machine

    cfg = compose("train", ARGS + [f"paths.datasets_dir={tmp_path}", "train.hidden_states=online"])
    identity = dataset_identity(cfg, resolve_target(cfg.model, cfg.paths.cache_dir))
    ds = token_dataset_path(identity, token_fingerprint_inputs(identity))
    monkeypatch.setenv("EAGLE3_LOCK_WAIT_S", "1")
    proc = _holder(ds / LOCK, "hold", 60)  # rank 0 writing the token dataset
    try:
        pid = int(proc.stdout.readline())
        with at_most(60), pytest.raises(LockHeldError, match=f"online dataset is being written: .* held by pid {pid}"):
            prepare_token_dataset(identity, regen_machine(cfg), cfg.head.draft_vocab_size)
    finally:
        proc.kill()
        proc.wait(30)


def test_a_symlinked_lock_file_is_refused_and_its_target_left_alone(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    path = tmp_path / ".lock"
    path.symlink_to(victim)
    with pytest.raises(OSError, match="must not be a symlink"):
        DirLock(path, "a test").acquire()
    assert victim.read_text() == "keep me"  # not truncated, not written through
