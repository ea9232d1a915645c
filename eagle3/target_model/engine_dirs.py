"""What a vLLM engine started in this process runs with, so that nothing of it outlives this
process: a directory of its own for its IPC sockets (``VLLM_RPC_BASE_PATH``: by default vLLM puts
them loose in the temp dir, where the sockets of killed engines pile up), a spill directory where
the engine writes files for this process (the capture's hidden states), and a reaper
(eagle3/util/processes.py) started before the engine starts any process: should this process be
killed (SIGKILL, the OOM killer), it ends the engine's processes and removes both directories
within seconds. On SIGTERM the directories' own handler does the same (spill_dirs.py).

Both engines that run the target in an eagle3 process use it: the capture's
(eagle3/target_model/capture_vllm.py) and the regeneration's
(eagle3/target_model/generate/vllm_engine.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from eagle3.target_model.spill_dirs import make_ipc_dir, make_spill_dir, release_spill_dir
from eagle3.util.processes import Reaper, start_reaper

RPC_BASE_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM puts its ZMQ sockets; read as the engine starts


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for a block, then restore them (later engines start clean)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class EngineDirs:
    """The IPC socket directory, the spill directory (``spill``: made in ``spill_dir``, default
    ``spill_dirs.default_spill_dir()``) and the reaper of one engine; make it before the engine
    starts, ``release()`` once the engine is shut down."""

    def __init__(self, *, spill: bool = False, spill_dir: str | None = None):
        self.spill, self.ipc = "", ""
        self.reaper: Reaper | None = None
        try:
            if spill:
                self.spill = make_spill_dir(spill_dir)
            self.ipc = make_ipc_dir()
            self.reaper = start_reaper([p for p in (self.spill, self.ipc) if p])
        except BaseException:
            self.release()
            raise

    def env(self) -> dict[str, str]:
        """The variables the engine must start with (``environment``)."""
        return {RPC_BASE_ENV: self.ipc}

    def release(self) -> None:
        """Remove the directories and stop the reaper (the engine ended the ordinary way)."""
        if self.spill:
            release_spill_dir(self.spill)
            self.spill = ""
        if self.ipc:
            release_spill_dir(self.ipc)
            self.ipc = ""
        reaper, self.reaper = self.reaper, None
        if reaper is not None:
            reaper.stop()
