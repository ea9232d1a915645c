"""vLLM's speculative-decoding counters, and the figures derived from them.

vLLM (0.32) keeps cumulative Prometheus counters since engine start:

    vllm:spec_decode_num_drafts                  verify steps that carried drafts
    vllm:spec_decode_num_draft_tokens            draft tokens proposed
    vllm:spec_decode_num_accepted_tokens         draft tokens the target accepted
    vllm:spec_decode_num_accepted_tokens_per_pos accepted tokens at draft position 0..K-1

`LLM.get_metrics()` returns them as objects with `.name` and `.value` (a vector: `.values`),
one per engine label set; they are summed over label sets. A batch's figures are the
difference of two snapshots taken around it (warm-up requests fall outside).

Mean acceptance length = 1 + accepted / drafts: tokens emitted per target forward (the
target's own token plus the accepted drafts). Acceptance rate at position i =
accepted_per_pos[i] / drafts (the share of verify steps that accepted draft i, which
implies drafts 0..i-1 were accepted too).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
NAMES = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)


class CounterError(RuntimeError):
    pass


def _add_vectors(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


@dataclass
class SpecDecodeCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @classmethod
    def from_metrics(cls, metrics: Iterable[Any], num_draft_tokens: int) -> "SpecDecodeCounters":
        """Sum the spec-decode counters over label sets. A vector shorter than K (vLLM
        registers positions lazily) is padded with zeros; a longer one is an error."""
        out = cls(accepted_per_position=[0] * num_draft_tokens)
        for m in metrics:
            name = getattr(m, "name", None)
            if name == DRAFTS:
                out.drafts += int(m.value)
            elif name == DRAFT_TOKENS:
                out.draft_tokens += int(m.value)
            elif name == ACCEPTED:
                out.accepted_tokens += int(m.value)
            elif name == ACCEPTED_PER_POS:
                values = [int(v) for v in m.values]
                if len(values) > num_draft_tokens:
                    raise CounterError(
                        f"{ACCEPTED_PER_POS}: {len(values)} positions, but the engine was built with "
                        f"num_speculative_tokens={num_draft_tokens}"
                    )
                out.accepted_per_position = _add_vectors(out.accepted_per_position, values)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpecDecodeCounters":
        return cls(
            int(d["drafts"]),
            int(d["draft_tokens"]),
            int(d["accepted_tokens"]),
            [int(v) for v in d["accepted_per_position"]],
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __sub__(self, before: "SpecDecodeCounters") -> "SpecDecodeCounters":
        n = max(len(self.accepted_per_position), len(before.accepted_per_position))
        pad = lambda v: v + [0] * (n - len(v))  # noqa: E731
        diff = SpecDecodeCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted_tokens - before.accepted_tokens,
            [a - b for a, b in zip(pad(list(self.accepted_per_position)), pad(list(before.accepted_per_position)))],
        )
        if min([diff.drafts, diff.draft_tokens, diff.accepted_tokens, *diff.accepted_per_position]) < 0:
            raise CounterError(
                f"spec-decode counters went down between snapshots (before={before}, after={self}): "
                "the snapshots are not from one engine"
            )
        return diff

    def __add__(self, other: "SpecDecodeCounters") -> "SpecDecodeCounters":
        return SpecDecodeCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted_tokens + other.accepted_tokens,
            _add_vectors(list(self.accepted_per_position), list(other.accepted_per_position)),
        )

    # ------------------------------------------------------------------ derived figures

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else math.nan

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else math.nan

    @property
    def per_position_acceptance_rate(self) -> list[float]:
        return [a / self.drafts if self.drafts else math.nan for a in self.accepted_per_position]

    def inconsistencies(self, num_draft_tokens: int) -> list[str]:
        """vLLM's own invariants; a violation means the counters were misread."""
        problems = []
        if sum(self.accepted_per_position) != self.accepted_tokens:
            problems.append(
                f"sum of accepted_per_position {sum(self.accepted_per_position)} != accepted_tokens {self.accepted_tokens}"
            )
        if self.accepted_tokens > self.draft_tokens:
            problems.append(f"accepted_tokens {self.accepted_tokens} > draft_tokens {self.draft_tokens}")
        if self.draft_tokens > self.drafts * num_draft_tokens:
            problems.append(f"draft_tokens {self.draft_tokens} > drafts {self.drafts} x K={num_draft_tokens}")
        if any(b > a for a, b in zip(self.accepted_per_position, self.accepted_per_position[1:])):
            problems.append(f"accepted_per_position {self.accepted_per_position} increases with position")
        return problems


def counters_from_histograms(histograms: Iterable[list[int]], num_draft_tokens: int) -> SpecDecodeCounters:
    """The same counters rebuilt from vLLM's per-request acceptance histograms
    (`per_request_spec_decode_metrics="summary"`: h[j] = verify steps that accepted j drafts).
    draft_tokens is not recoverable from a histogram; callers compare the other fields."""
    out = SpecDecodeCounters(accepted_per_position=[0] * num_draft_tokens)
    for h in histograms:
        for j, steps in enumerate(h):
            out.drafts += steps
            out.accepted_tokens += j * steps
            for pos in range(min(j, num_draft_tokens)):
                out.accepted_per_position[pos] += steps
    return out


def histogram_from_counters(counters: SpecDecodeCounters, num_draft_tokens: int) -> list[int]:
    """One request's acceptance histogram from its counter difference (the inverse of
    ``counters_from_histograms`` for one request): with one request in flight, the difference
    around it is its own. Acceptance is a prefix, so accepted_per_position[i] counts the verify
    steps that accepted at least i+1 drafts: h[0] = drafts - app[0], h[j] = app[j-1] - app[j],
    h[K] = app[K-1]. A negative entry means the difference is not one engine's consistent counts."""
    app = list(counters.accepted_per_position) + [0] * (num_draft_tokens - len(counters.accepted_per_position))
    if len(app) > num_draft_tokens:
        raise CounterError(f"accepted_per_position {app}: more than K={num_draft_tokens} positions")
    at_least = [counters.drafts, *app]  # steps that accepted >= j drafts, j = 0..K
    h = [at_least[j] - at_least[j + 1] for j in range(num_draft_tokens)] + [at_least[num_draft_tokens]]
    if min(h) < 0:
        raise CounterError(
            f"counters {counters.to_dict()}: accepted_per_position must not increase nor exceed drafts "
            "to be one request's acceptance histogram"
        )
    return h


def acceptance_length_of_histogram(h: list[int]) -> float:
    steps = sum(h)
    return 1.0 + sum(j * n for j, n in enumerate(h)) / steps if steps else math.nan
