"""Nothing left running, nothing deleted while live (issue 48), with real processes and kills:
a vLLM capture killed by SIGKILL leaves no engine process, no spill directory and no IPC socket
directory 10 s later (its reaper ends them), and so does extract.py killed while vLLM regenerates
the answers; the stale-spill cleanup leaves a live capture's
directory alone though it runs in another PID namespace or on another machine, and removes it
once its owner's heartbeat stopped."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT
from helpers.processes import VLLM_CAPTURE, gone, kill_all, wait_for

from eagle3.target_model.spill_dirs import IPC_PREFIX, OWNER_FILE, SPILL_PREFIX, make_spill_dir, release_spill_dir
from eagle3.util import faults, owner


@pytest.fixture
def short_tmp():
    """A temp dir for a capture process with a path short enough for vLLM's sockets (pytest's
    tmp_path is too long for a unix socket's 107 bytes)."""
    path = tempfile.mkdtemp(prefix="e3-")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_killed_real_vllm_capture_leaves_no_engine_and_no_spill_after_10_s(tmp_path, short_tmp, smollm2_dir, sig):
    """SIGKILL: its reaper ends vLLM's processes and removes the spill dir; SIGTERM: its handler
    does, the spill dir gone before the process dies. Nothing left after 10 s either way."""
    pytest.importorskip("vllm")
    spill_parent, tmp = tmp_path / "spill", short_tmp  # the capture's temp dir: vLLM's sockets went there
    spill_parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", VLLM_CAPTURE, str(smollm2_dir), str(spill_parent)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    children: list[psutil.Process] = []
    try:
        path = next((line.split(" ", 1)[1].strip() for line in proc.stdout if line.startswith("SPILL ")), "")
        assert path and os.path.isdir(path), f"the capture did not start (exit {proc.poll()})"
        children = psutil.Process(proc.pid).children(recursive=True)
        engine = [c for c in children if "EngineCore" in " ".join(c.cmdline())]
        assert engine, f"no VLLM::EngineCore among {[c.cmdline() for c in children]}"
        assert any(p.name.startswith("eagle3-vllm-ipc-") for p in tmp.iterdir())  # its sockets are there
        proc.send_signal(sig)
        assert proc.wait(30) == -sig
        if sig == signal.SIGTERM:  # its handler removed the spill dir before the process died
            assert not os.path.exists(path)
        t0 = time.monotonic()
        ended = wait_for(lambda: all(gone(c) for c in children), 10)
        left = [c.cmdline() for c in children if not gone(c)]
        assert ended, f"after 10 s these outlived the killed capture: {left}"
        assert wait_for(lambda: not any(spill_parent.iterdir()), 10 - (time.monotonic() - t0))
        assert not [p.name for p in tmp.iterdir() if p.name.startswith("eagle3-vllm-ipc-")]
    finally:
        kill_all(proc, children)


# extract.py regenerating the answers with vLLM (SmolLM2, batches of two), killed by SIGKILL at the
# fault point after its second batch of answers is cached: its engine is up and answering
REGEN_ARGS = [
    "experiment=tiny_test",
    "model=smollm2_135m",
    "data.regenerate=true",
    "data.regen_backend=vllm",
    "data.regen_max_tokens=4",
    "data.regen_max_turns=1",
    "data.regen_batch_size=2",
    "data.max_samples=6",
    "capture.cpu_kvcache_space_gb=1",
]


@pytest.mark.slow
@pytest.mark.vllm
def test_extract_killed_while_vllm_regenerates_leaves_no_engine_and_no_socket_dir_after_10_s(
    tmp_path, short_tmp, smollm2_dir
):
    pytest.importorskip("vllm")
    cache = tmp_path / "cache"  # its own answer cache, the materialised SmolLM2 shared
    cache.mkdir()
    (cache / "targets").symlink_to(smollm2_dir.parent)
    args = [*REGEN_ARGS, f"paths.cache_dir={cache}", f"paths.datasets_dir={tmp_path / 'data'}"]
    log = tmp_path / "extract.log"  # vLLM logs a lot: a pipe left unread would stall it
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "extract.py", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": str(short_tmp), faults.ENV: "regen@2"},
        )
    seen: dict[int, psutil.Process] = {}  # every descendant while it ran: it dies with no warning
    names: dict[int, str] = {}  # their command lines (vLLM retitles its engine core once started)
    ipc_seen = False
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for c in children:
                seen.setdefault(c.pid, c)
                try:
                    names[c.pid] = " ".join(c.cmdline())
                except psutil.Error:
                    pass
            ipc_seen = ipc_seen or any(p.name.startswith(IPC_PREFIX) for p in short_tmp.iterdir())
            time.sleep(0.1)
        assert proc.wait(30) == -signal.SIGKILL, f"exit {proc.returncode}:\n{log.read_text()[-3000:]}"
        t0 = time.monotonic()
        assert any("EngineCore" in n for n in names.values()), f"no VLLM::EngineCore among {list(names.values())}"
        assert ipc_seen  # the engine's sockets were in a directory of its own
        ended = wait_for(lambda: all(gone(c) for c in seen.values()), 10)
        left = [names.get(c.pid, c.pid) for c in seen.values() if not gone(c)]
        assert ended, f"after 10 s these outlived the killed extract.py: {left}"
        assert wait_for(
            lambda: not any(p.name.startswith(IPC_PREFIX) for p in short_tmp.iterdir()), 10 - (time.monotonic() - t0)
        )
        (answers,) = (cache / "regenerated").glob("*.jsonl")
        assert len(answers.read_text().splitlines()) == 4  # killed during regeneration: two batches of two
    finally:
        kill_all(proc, seen.values())


# a caller as a capture is: the reaper started, then a process of its own (vLLM's engine core
# stands there) that ignores SIGTERM, with a child of its own, and a directory to remove
REAPED_CALLER = textwrap.dedent("""
    import os, subprocess, sys, time
    from eagle3.util.processes import start_reaper
    reaper = start_reaper([sys.argv[1]])
    engine = subprocess.Popen([sys.executable, "-c", "import signal, subprocess, sys, time; "
                               "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)"])
    time.sleep(1.5)  # the reaper has seen them
    print(reaper.proc.pid, flush=True)
    time.sleep(300)
""")


def test_the_reaper_ends_what_a_killed_caller_started_and_removes_its_dirs(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", REAPED_CALLER, str(spill)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    children: list[psutil.Process] = []
    try:
        reaper = int(proc.stdout.readline())
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 3 and reaper in [c.pid for c in children]  # the reaper, the "engine", its child
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        assert wait_for(lambda: all(gone(c) for c in children), 10), [c.cmdline() for c in children if not gone(c)]
        assert not spill.exists()
    finally:
        kill_all(proc, children)


def test_a_stopped_reaper_leaves_the_callers_processes_alone(tmp_path):
    from eagle3.util.processes import start_reaper

    keep = tmp_path / "keep"
    keep.mkdir()
    reaper = start_reaper([keep])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = reaper.proc
        reaper.stop()
        assert proc.returncode == 0 and child.poll() is None and keep.is_dir()
    finally:
        child.kill()
        child.wait(30)


# ---------------------------------------------------------------- whose spill directory is stale


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _foreign_spill(parent, age_s: float, **record) -> str:
    """A spill directory as a capture elsewhere made it: same host name, its pid free here."""
    path = make_spill_dir(str(parent))
    rec = {**owner.identity(), "pid": _dead_pid(), **record}
    # renamed to the foreign owner's pid, its record rewritten, our heartbeat on it stopped
    foreign = path.replace(f"{SPILL_PREFIX}{os.getpid()}@", f"{SPILL_PREFIX}{rec['pid']}@")
    os.rename(path, foreign)
    release_spill_dir(path)
    owner.write_record(os.path.join(foreign, OWNER_FILE), rec)
    t = time.time() - age_s
    os.utime(os.path.join(foreign, OWNER_FILE), (t, t))
    return foreign


@pytest.mark.parametrize(
    "where", [{"pid_ns": 1}, {"boot_id": "0" * 36}], ids=["another PID namespace", "another machine"]
)
def test_a_live_capture_elsewhere_keeps_its_spill_dir_until_its_heartbeat_stops(tmp_path, where):
    live = _foreign_spill(tmp_path, 60, **where)  # heartbeat a minute old: working
    stale = _foreign_spill(tmp_path, owner.STALE_S + 60, **where)
    mine = make_spill_dir(str(tmp_path))  # what the next capture does first
    try:
        assert os.path.isdir(live) and not os.path.exists(stale)
    finally:
        release_spill_dir(mine)


def test_a_spill_dir_of_a_capture_dead_in_this_namespace_is_removed_at_once(tmp_path):
    dead = _foreign_spill(tmp_path, 0)
    mine = make_spill_dir(str(tmp_path))
    try:
        assert not os.path.exists(dead) and os.path.isfile(os.path.join(mine, OWNER_FILE))
        assert owner.read_record(os.path.join(mine, OWNER_FILE))["pid_ns"] == owner.pid_namespace()
    finally:
        release_spill_dir(mine)


# ---------------------------------------------------------------- nothing left in the temp dir

# a test's compose (no output_dir) and a short capture that closes its engine, as the suite runs them
COMPOSE_AND_ENGINE = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, "tests")
    from conftest import compose
    compose("train", ["experiment=tiny_test"])
    from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend
    engine = CaptureEngine(max_model_len=256, max_num_seqs=2, cpu_kvcache_space_gb=1, enforce_eager=True)
    with VLLMCaptureBackend(sys.argv[1], (2, 15, 27, 30), engine=engine, spill_dir=sys.argv[2]) as backend:
        ids = torch.arange(1, 20)
        assert len(list(backend.capture([("s0", ids, torch.ones_like(ids, dtype=torch.bool))]))) == 1
""")


@pytest.mark.slow
@pytest.mark.vllm
def test_a_compose_and_an_engine_run_leave_nothing_in_the_temp_dir(tmp_path, short_tmp, smollm2_dir):
    pytest.importorskip("vllm")
    spill_parent, tmp = tmp_path / "spill", short_tmp
    spill_parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", COMPOSE_AND_ENGINE, str(smollm2_dir), str(spill_parent)],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    # no eagle3-run-*, no vLLM socket: nothing but torch's compile cache (one per user, reused)
    assert sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")) == []
    assert list(spill_parent.iterdir()) == []
    assert not list((ROOT / ".cache" / "test-runs").glob(f"compose-{proc.pid}-*"))  # compose's root, removed


def test_an_evaluation_engine_gets_its_own_socket_dir_and_it_is_gone_after(tmp_path):
    """The acceptance and serving engines run with VLLM_RPC_BASE_PATH pointing at a directory of
    their own, removed when the engine process ends (a stand-in engine records what it was given)."""
    import json as _json

    from eagle3.config.engine import EngineOptions
    from eagle3.evaluation.engine_io import EngineRequest
    from eagle3.evaluation.subprocess_engine import run_engine_process

    seen = tmp_path / "seen.json"
    stand_in = (
        "import json, os, sys; d = os.environ['VLLM_RPC_BASE_PATH']; "
        f"json.dump({{'dir': d, 'existed': os.path.isdir(d)}}, open({str(seen)!r}, 'w')); "
        "json.dump({'vllm_version': 'x', 'platform': 'cpu', 'enforce_eager': True, 'load_seconds': 0.0, "
        "'warmup_seconds': 0.0, 'batches': []}, open(sys.argv[-1], 'w'))"
    )
    request = EngineRequest(
        model="m", head=None, num_draft_tokens=0, max_new_tokens=1, max_model_len=8, batches=[], options=EngineOptions()
    )
    run_engine_process(request, tmp_path / "work", "stand-in", command=[sys.executable, "-c", stand_in])
    given = _json.loads(seen.read_text())
    assert given["existed"] and Path(given["dir"]).name.startswith("eagle3-vllm-ipc-")
    assert not Path(given["dir"]).exists()
