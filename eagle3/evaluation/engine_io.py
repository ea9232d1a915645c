"""What crosses between the evaluation and its vLLM engine process (eagle3/evaluation/engine.py):
the request (the target, the head, the prompt batches and how the engine is built) written as
JSON for the engine, and the result (per batch: outputs, timings, counters) it writes back; and
how plain batches are run as one call and split back. Imports no vLLM: the callers build and read
these without starting an engine."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from eagle3.config.engine import EngineOptions


@dataclass
class PromptBatch:
    name: str  # a prompt set ("broad", "humaneval", "val", ...) or a serving load
    prompts: list[list[int]]  # token ids, already rendered with the chat template
    # None: one generate() call over all prompts (vLLM schedules them as it likes). c: calls of
    # exactly c prompts each, one after the other (a serving load of c requests in flight).
    wave_size: Optional[int] = None
    ignore_eos: bool = False  # every request runs to max_new_tokens (waves of equal length)
    # c: the prompts queue up and c are in flight at every moment, a request starting as soon as
    # one ends, as a server under a steady load of c sees them (natural EOS: lengths differ)
    concurrency: Optional[int] = None
    # per prompt, None or {"messages": the first turn's chat messages, "question": a second user
    # turn}: after the first pass, the second turn is served as the first turn, the engine's own
    # greedy answer to it, and the question (rendered with the chat template), in a second pass
    second_turns: Optional[list[Optional[dict[str, Any]]]] = None
    # per prompt, its category (None: the set is one). Where vLLM gives no per-request figures the
    # engine runs each category as a call of its own, its counters read around it
    # (eagle3/evaluation/category_calls.py): the only route to per-category figures there
    categories: Optional[list[str]] = None


@dataclass
class EngineRequest:
    model: str  # the target directory or hub id
    head: Optional[str]  # the EAGLE-3 export directory; None: the target alone
    num_draft_tokens: int
    max_new_tokens: int
    max_model_len: int
    batches: list[PromptBatch]
    # how the engine is built, the same for the engine with the head and the one without. The
    # engine reads enforce_eager, tensor_parallel_size, gpu_memory_utilization, max_num_seqs, dtype,
    # seed, trust_remote_code, load_format and quantization; the rest is the parent's: timeout_s and cpu_kvcache_space_gb
    # (VLLM_CPU_KVCACHE_SPACE, set before the engine starts) are read by run_engine_process, and
    # max_prompt_tokens chose the prompts before the request was built
    options: EngineOptions = field(default_factory=EngineOptions)
    warmup_prompts: int = 1  # the first warm-up call's size (a bench warms up at its largest wave)
    # plain batches (no waves, no queue) run as one generate() call and are split back per batch
    # where vLLM gives per-request figures to split the counters by (each call costs a full answer's
    # steps: on a CPU, four sets one after the other took 1.4x the time of two). Each batch's
    # seconds are then the call's, shared by generated tokens (its tok/s is the call's)
    together: bool = False
    chat_template: Optional[str] = None  # renders second turns (None: the tokenizer's own)
    # the template's extra arguments for second turns (the dataset's data.chat_template_kwargs)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # vLLM's per-request spec-decode figures (per_request_spec_decode_metrics): None asks for them
    # where the installed vLLM offers them (0.32 does, CUDA 0.26 does not); False runs without them
    # as an engine that lacks them does (each category its own call, figures from the counters)
    per_request: Optional[bool] = None
    # without per-request figures (eval.prompts_apart): each prompt of a plain batch a generate()
    # call of its own, the counters read around each of its turns, so each request gets its own
    # histogram (intervals over prompts) at the cost of no batching. Ignored where vLLM gives them
    prompts_apart: bool = False
    # without per-request figures (eval.step_figures): plain batches run concurrently as ever, driven
    # step by step, each request's histogram rebuilt from the tokens each step adds to it
    # (eagle3/evaluation/step_tally.py). Wins over prompts_apart; ignored where vLLM gives figures
    step_figures: bool = False

    def warmup_sizes(self) -> list[int]:
        """Requests per warm-up call: ``warmup_prompts``, then each other wave size of the batches.
        vLLM compiles some kernels at the first batch of a new size (Triton's fused-MoE kernel,
        one config per token-count range): a load measured cold pays that compilation inside its
        timed waves, which made an MoE target's figures at a load seen for the first time noise."""
        first = max(1, self.warmup_prompts)
        waves = sorted({b.wave_size for b in self.batches if b.wave_size and b.prompts} - {first})
        return [first, *waves]

    @classmethod
    def from_json(cls, text: str) -> "EngineRequest":
        raw = json.loads(text)
        raw["batches"] = [PromptBatch(**b) for b in raw["batches"]]
        raw["options"] = EngineOptions(**raw.get("options", {}))
        return cls(**raw)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class BatchResult:
    name: str
    outputs: list[list[int]]  # generated token ids per prompt, in prompt order
    seconds: float  # wall time of the batch's generate() call(s)
    counters: Optional[dict[str, Any]] = None  # SpecDecodeCounters difference around the batch
    histograms: Optional[list[list[int]]] = None  # per request: verify steps that accepted j drafts
    wave_sizes: Optional[list[int]] = None  # requests per generate() call, in order
    preemptions: Optional[int] = None  # vllm:num_preemptions around the batch (0: none evicted)
    # second turns, after the first turns in outputs/histograms: {"of": the first turn's index,
    # "prompt_tokens": the rendered second turn's length}
    followups: Optional[list[dict[str, int]]] = None
    finish_reasons: Optional[list[str]] = None  # per request: "stop" (EOS) or "length" (max_tokens)
    # per category, the counter difference around its own call (no per-request figures: the
    # batch's counters are their sum); None where the set ran as one call
    category_counters: Optional[dict[str, dict[str, Any]]] = None

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


@dataclass
class EngineResult:
    vllm_version: str
    platform: str
    enforce_eager: bool
    load_seconds: float
    warmup_seconds: float
    batches: list[BatchResult] = field(default_factory=list)
    # the engine counters around the one call the batches ran in together (None: each on its own);
    # the batches' counters are rebuilt from their requests' histograms, which must add up to these
    together_counters: Optional[dict[str, Any]] = None
    per_request: bool = True  # whether there are per-request spec-decode figures (vLLM's, or prompts apart)
    prompts_apart: bool = False  # each prompt ran as a call of its own, its figures from the counters
    step_figures: bool = False  # each request's figures rebuilt from the tokens of each engine step

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "EngineResult":
        raw = json.loads(text)
        raw["batches"] = [BatchResult(**b) for b in raw["batches"]]
        return cls(**raw)


def merge_batches(batches: list[PromptBatch]) -> PromptBatch:
    """Plain batches as one: their prompts in order, their second turns beside them."""
    turns = [t for b in batches for t in (b.second_turns or [None] * len(b.prompts))]
    prompts = [p for b in batches for p in b.prompts]
    return PromptBatch(
        "together", prompts, ignore_eos=batches[0].ignore_eos, second_turns=turns if any(turns) else None
    )


def split_batch(whole: BatchResult, batches: list[PromptBatch], k: int) -> list[BatchResult]:
    """``whole`` (the merged batches' result: first turns in order, then the second turns) back into
    one result per batch: its requests' outputs, histograms and finish reasons, its counters rebuilt
    from its histograms (draft tokens shared by verify steps), its share of the seconds by tokens."""
    from eagle3.evaluation.counters import counters_from_histograms

    n_first = sum(len(b.prompts) for b in batches)
    total_tokens = max(1, whole.generated_tokens)
    total_drafts = (whole.counters or {}).get("drafts", 0)
    out, start = [], 0
    for b in batches:
        end = start + len(b.prompts)
        rows = list(range(start, end))
        follow = [(j, f) for j, f in enumerate(whole.followups or []) if start <= f["of"] < end]
        rows += [n_first + j for j, _ in follow]

        def pick(values: Optional[list], rows: list[int] = rows) -> Optional[list]:
            return [values[i] for i in rows] if values is not None else None

        part = BatchResult(b.name, [whole.outputs[i] for i in rows], 0.0, None, pick(whole.histograms),
                           preemptions=whole.preemptions, finish_reasons=pick(whole.finish_reasons))  # fmt: skip
        part.followups = [{"of": f["of"] - start, "prompt_tokens": f["prompt_tokens"]} for _, f in follow] or None
        part.seconds = whole.seconds * part.generated_tokens / total_tokens
        if whole.counters is not None and part.histograms is not None:
            counters = counters_from_histograms(part.histograms, k)
            share = counters.drafts / total_drafts if total_drafts else 0.0
            counters.draft_tokens = round(whole.counters.get("draft_tokens", 0) * share)
            part.counters = counters.to_dict()
        out.append(part)
        start = end
    return out
