"""Why did a greedy output change when the head was on? Ask the target in fp32.

Speculative decoding with greedy verification should reproduce the target's own greedy
output token for token; in practice vLLM verifies K+1 positions in one bf16 forward where
plain decoding runs one position per step, and a near tie between the top two tokens can
flip. A real bug (a wrong verification, a broken KV cache) instead picks a token the target
clearly does not prefer. So for each mismatch we rerun the target in fp32 (transformers)
on the prompt plus the shared prefix and read the logits of the two tokens the engines
chose: a small gap is numerics, a large one is a problem worth a red line in the report.

On SmolLM2-135M every mismatch seen so far was a near tie under the fp32 check
(docs/records/2026-12-01-train-side-estimates.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

NEAR_TIE_LOGITS = 1.0  # |fp32 logit(with) - logit(without)| below this: a numerics flip
MAX_REFERENCE_BYTES = 8 << 30  # fp32 reference forwards only for targets up to ~2B params


@dataclass
class MismatchCase:
    id: str
    prompt_ids: list[int]
    prefix_ids: list[int]  # the output both engines agree on
    with_head_token: int
    without_head_token: int


@dataclass
class MismatchVerdict:
    id: str
    position: int
    with_head_token: int
    without_head_token: int
    logit_gap_fp32: float  # logit(with-head token) - logit(without-head token)
    reference_token: int  # the fp32 argmax
    near_tie: bool

    def describe(self) -> str:
        pick = (
            "with-head's"
            if self.reference_token == self.with_head_token
            else "without-head's"
            if self.reference_token == self.without_head_token
            else "neither engine's"
        )
        kind = "near tie (numerics)" if self.near_tie else "NOT a near tie"
        return (
            f"{self.id} at output token {self.position}: fp32 logits of the two tokens differ by "
            f"{self.logit_gap_fp32:+.3f}, {kind}; fp32 argmax is {pick} token"
        )


def weights_bytes(target_dir: str | Path) -> int:
    d = Path(target_dir)
    return sum(p.stat().st_size for p in d.glob("*.safetensors")) + sum(p.stat().st_size for p in d.glob("*.bin"))


def explain(
    target: str | Path, cases: list[MismatchCase], device: Optional[str] = None, trust_remote_code: bool = False
) -> list[MismatchVerdict]:
    """One fp32 forward per case (prompt + shared prefix) through the target."""
    if not cases:
        return []
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = (
        AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32, trust_remote_code=trust_remote_code)
        .to(device)
        .eval()
    )
    out = []
    with torch.inference_mode():
        for c in cases:
            ids = torch.tensor([c.prompt_ids + c.prefix_ids], device=device)
            logits = model(input_ids=ids).logits[0, -1].float()
            gap = float(logits[c.with_head_token] - logits[c.without_head_token])
            out.append(
                MismatchVerdict(
                    id=c.id,
                    position=len(c.prefix_ids),
                    with_head_token=c.with_head_token,
                    without_head_token=c.without_head_token,
                    logit_gap_fp32=gap,
                    reference_token=int(logits.argmax()),
                    near_tie=abs(gap) < NEAR_TIE_LOGITS,
                )
            )
    del model
    return out


def cases_from(
    prompts: list[list[int]], ids: list[str], with_head: list[list[int]], without_head: list[list[int]]
) -> list[MismatchCase]:
    """The prompts whose outputs differ, cut at the first differing token (a length-only
    difference, one output a prefix of the other, has no token pair to compare)."""
    cases = []
    for pid, prompt, a, b in zip(ids, prompts, with_head, without_head):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is not None:
            cases.append(MismatchCase(pid, list(prompt), list(a[:k]), int(a[k]), int(b[k])))
    return cases
