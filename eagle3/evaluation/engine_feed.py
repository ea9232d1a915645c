"""How prompts are fed to a vLLM engine (eagle3/evaluation/engine.py runs these inside its process):
in waves or as one generate() call, through a queue that keeps a load in flight, or step by step
with each request's acceptance histogram rebuilt from the tokens each step adds to it (where vLLM
gives no per-request figures: eagle3/evaluation/step_tally.py). Imports vLLM only inside the
functions, as engine.py does.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

from eagle3.evaluation.engine_io import EngineRequest, PromptBatch


def first_pass(llm: Any, batch: PromptBatch, params: Any) -> tuple[list[Any], Optional[list[int]]]:
    """The batch's outputs in prompt order, and the wave sizes where it runs in waves."""
    from vllm.inputs import TokensPrompt

    if batch.concurrency:
        return queue(llm, batch.prompts, params, batch.concurrency), None
    step = batch.wave_size or len(batch.prompts)
    waves = [batch.prompts[i : i + step] for i in range(0, len(batch.prompts), step)]
    outs: list[Any] = []
    for wave in waves:  # each call returns when its last request ends: the next starts alone
        outs += llm.generate([TokensPrompt(prompt_token_ids=p) for p in wave], params, use_tqdm=False)
    return outs, [len(w) for w in waves] if batch.wave_size else None


def queue(llm: Any, prompts: list[list[int]], params: Any, concurrency: int) -> list[Any]:
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


def stepped(
    llm: Any, prompts: list[list[int]], req: EngineRequest, stop_ids: set[int]
) -> list[tuple[list[int], str, Optional[list[int]]]]:
    """Every prompt through the engine at once (max_num_seqs in flight, as generate() runs them),
    driven step by step with each step's new tokens per request (DELTA), each request's histogram
    rebuilt from them (StepTally). vLLM counts a step's accepted drafts before it cuts the step at a
    stop token or max_tokens, so it is asked for max_new_tokens + K tokens without stopping at EOS;
    the tally ends each answer where vLLM would have (its first stop token, or max_new_tokens) and
    the request is aborted there: its last step arrives whole, and no later step of it counts in the
    tally. vLLM's engine core runs on meanwhile: a step of the request that ends before the abort
    reaches it is counted by the engine counters though not by the tally (the figures' check
    against the counters then says so); the client does no detokenizing, to answer fast."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from eagle3.evaluation.step_tally import StepTally

    k = req.num_draft_tokens
    params = SamplingParams(temperature=0.0, max_tokens=req.max_new_tokens + k, ignore_eos=True, detokenize=False)
    params.output_kind = RequestOutputKind.DELTA
    tally = StepTally(k, req.max_new_tokens, stop_ids)
    engine = llm.llm_engine
    ids = [f"eagle3-step-{next(STEP_IDS)}" for _ in prompts]
    for rid, p in zip(ids, prompts):
        tally.add_request(rid)
        engine.add_request(rid, TokensPrompt(prompt_token_ids=p), params)
    live = set(ids)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id not in live:
                continue
            answer = out.outputs[0]
            if tally.add(out.request_id, list(answer.token_ids), out.finished, answer.finish_reason):
                live.discard(out.request_id)
                if not out.finished:
                    engine.abort_request([out.request_id])
    if tally.clipped():
        raise RuntimeError(f"step figures: {tally.clipped()} steps added more than K + 1 = {k + 1} tokens")
    return [(tally.tokens(r), str(tally.finish_reason(r)), tally.histogram(r)) for r in ids]


STEP_IDS = itertools.count()  # request ids unique over the engine's life


def stop_ids(llm: Any) -> set[int]:
    """The tokens that end a greedy answer in this engine, as vLLM takes them: the tokenizer's EOS
    and the generation config's eos_token_id(s)."""
    gen = llm.llm_engine.model_config.try_get_generation_config().get("eos_token_id")
    eos = llm.get_tokenizer().eos_token_id
    return ({eos} if eos is not None else set()) | ({gen} if isinstance(gen, int) else set(gen or ()))
