"""data.regen_backend=vllm: the target answers through vLLM (the CPU build here, CUDA vLLM elsewhere).

The engine runs as the capture's does (eagle3/target_model/engine_dirs.py): its IPC sockets in a
directory of its own, and a reaper started before it that ends its processes and removes that
directory should extract.py be killed while it answers; ``close`` shuts it down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3.target_model.engine_dirs import EngineDirs, environment
from eagle3.target_model.generate.common import Regenerator
from eagle3.target_model.quantization import engine_kwargs


class VLLMRegenerator(Regenerator):
    backend = "vllm"

    def __init__(
        self,
        target_dir: str,
        cache_dir: str | Path,
        *,
        cpu_kvcache_space_gb: int = 4,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        **kwargs,
    ):
        super().__init__(target_dir, cache_dir, **kwargs)
        self.engine_args = dict(
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size
        )
        self.kv_space = int(cpu_kvcache_space_gb)
        self._llm = None
        self._dirs: EngineDirs | None = None

    def _engine(self):
        if self._llm is None:
            started = time.monotonic()
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_space))
            import torch
            from vllm import LLM

            self._dirs = EngineDirs()  # before vLLM starts any process
            try:
                with environment(self._dirs.env()):  # read while the engine and its workers start
                    self._llm = LLM(**self.llm_kwargs(on_gpu=torch.cuda.is_available()))
            except BaseException:
                self.close()
                raise
            self.engine_start_s += time.monotonic() - started
        return self._llm

    def llm_kwargs(self, *, on_gpu: bool) -> dict[str, Any]:
        """The LLM(...) arguments of the answering engine, the served target's quantization
        (model.quantization) among them."""
        return dict(
            model=self.target_dir,
            dtype="bfloat16",
            max_model_len=self.max_model_len,
            seed=self.seed,
            enable_prefix_caching=True,
            trust_remote_code=self.trust_remote_code,
            # eager on CPU: vllm-cpu's compiled graph costs minutes to build here, and gave
            # wrong greedy answers in a mixed-length batch (measured: SmolLM2, vllm-cpu 0.32)
            enforce_eager=not on_gpu,
            **self.engine_args,
            **engine_kwargs(self.quantization),
        )

    def close(self) -> None:
        """Shut the engine down (its processes end now, not at garbage collection), then remove
        its socket directory and stop its reaper."""
        llm, self._llm = self._llm, None
        try:
            if llm is not None:
                from eagle3.target_model.vllm_internals import shutdown_engine

                shutdown_engine(llm)
                del llm
            super().close()
        finally:
            dirs, self._dirs = self._dirs, None
            if dirs is not None:
                dirs.release()

    @contextmanager
    def sampling(self, temperature: float, seed: int) -> Iterator[None]:
        """As the base; the engine is started first, with the answers' seed (every request
        carries its own seed, so the engine's is only its default)."""
        self._engine()
        with super().sampling(temperature, seed):
            yield

    def _complete(self, prompts: list[list[int]], rooms: list[int], seeds: list[int]) -> list[str]:
        from vllm import SamplingParams, TokensPrompt

        llm = self._engine()
        params = [
            SamplingParams(temperature=self.temperature, max_tokens=r, seed=s, skip_special_tokens=True)
            for r, s in zip(rooms, seeds)
        ]
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=True)
        self.new_tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        return [o.outputs[0].text for o in outs]
