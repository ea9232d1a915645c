"""Each request's acceptance histogram rebuilt from the tokens each engine step gives it.

Where vLLM gives no per-request spec-decode figures (CUDA vLLM 0.26), its engine-wide counters
are the only figures, and a counter difference covers every request in flight. But a step's
output says how many tokens it added to each request: driven step by step with
``RequestOutputKind.DELTA`` (eagle3/evaluation/engine.py), a request's first output (the end of
its prefill) adds 1 token and verifies nothing; each later output that adds n tokens is a verify
step that accepted n - 1 drafts (the target's own token is the n-th). So every request's
histogram (h[j] = its verify steps that accepted j drafts, as vLLM's per-request figures give
it) comes out of a batch run concurrently.

The last step is where that reading fails if vLLM ends the request itself: vLLM counts a step's
accepted drafts before it cuts the step's tokens at a stop token or at max_tokens, so the kept
tokens can be fewer than the step accepted (a request cut at max_tokens would read one step low;
docs/records/2026-12-07-cuda-figures-routes.md). So the engine asks for ``max_tokens + K`` tokens with
``ignore_eos`` (the step that crosses max_tokens, or holds a stop token, keeps every token it
accepted), and this tally ends each request itself: at its first stop token (kept, as vLLM keeps
it) or at max_tokens, whichever comes first, its tokens cut there, and ``add`` returns True so
that the caller aborts it before another step of it counts. vLLM skips the in-flight step of a
request aborted while that step runs, so the engine counters agree; but its engine core does not
wait for the caller: an abort that arrives after a further step of the request has finished leaves
that step in the counters (a slow client; the caller's check against the counters shows it).
What it still cannot see: a preempted request's recompute (its
first output again adds 1 token and verifies nothing, read here as a step that accepted 0), and a
step scheduled with fewer than K drafts; the caller checks the sums against the counters.

Imports no vLLM: the engine feeds it (request id, new token ids, vLLM's finished flag) per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional


@dataclass
class _Request:
    tokens: list[int] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)
    started: bool = False  # its prefill output came
    finish_reason: Optional[str] = None  # "stop" | "length" once ended (here or by vLLM)
    clipped: int = 0  # steps that added more than K + 1 tokens (read as K accepted)


class StepTally:
    """Per-request histograms of verify steps, from each step's new tokens.

    ``num_draft_tokens``: K (a histogram has K + 1 entries). ``max_tokens``: where a request ends
    ("length"); ``stop_ids``: the tokens that end it ("stop", the token kept)."""

    def __init__(self, num_draft_tokens: int, max_tokens: int, stop_ids: Iterable[int] = ()):
        if num_draft_tokens < 1 or max_tokens < 1:
            raise ValueError(f"K={num_draft_tokens} and max_tokens={max_tokens} must be >= 1")
        self.k = num_draft_tokens
        self.max_tokens = max_tokens
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self._requests: dict[str, _Request] = {}

    def add_request(self, request_id: str) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} added twice")
        self._requests[request_id] = _Request(histogram=[0] * (self.k + 1))

    def add(self, request_id: str, new_tokens: list[int], finished: bool = False, reason: Optional[str] = None) -> bool:
        """One step's output of a request: the tokens it added (DELTA) and whether vLLM ended it
        (``reason``: vLLM's finish reason). Returns True when the request is ended, here or by vLLM:
        the caller aborts one that vLLM did not end. Output after the end is ignored."""
        r = self._requests[request_id]
        if r.finish_reason is not None:
            return True
        if new_tokens:
            if r.started:
                accepted = len(new_tokens) - 1
                if accepted > self.k:
                    r.clipped += 1
                r.histogram[min(accepted, self.k)] += 1
            r.started = True
            for t in new_tokens:
                r.tokens.append(int(t))
                if int(t) in self.stop_ids:
                    r.finish_reason = "stop"
                elif len(r.tokens) >= self.max_tokens:
                    r.finish_reason = "length"
                if r.finish_reason is not None:
                    break
        if finished and r.finish_reason is None:
            r.finish_reason = str(reason) if reason is not None else "stop"
        return r.finish_reason is not None

    def ended(self, request_id: str) -> bool:
        return self._requests[request_id].finish_reason is not None

    def histogram(self, request_id: str) -> list[int]:
        return list(self._requests[request_id].histogram)

    def tokens(self, request_id: str) -> list[int]:
        return list(self._requests[request_id].tokens)

    def finish_reason(self, request_id: str) -> Optional[str]:
        return self._requests[request_id].finish_reason

    def clipped(self) -> int:
        """Steps, over all requests, that added more than K + 1 tokens (none expected)."""
        return sum(r.clipped for r in self._requests.values())
