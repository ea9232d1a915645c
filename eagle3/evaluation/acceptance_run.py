"""The acceptance run of a head: the target with the head, then the target alone, on the same prompts.

Both engines are built the same way (eager mode, batch limits, no prefix caching, seed,
max_model_len) and get the same token ids, one generate() call per prompt set, greedy,
same max_new_tokens, every answer ending at EOS (natural) or at max_new_tokens. A prompt with a
second user turn is asked again after each engine's own greedy answer (a second pass). The
engine with the head runs first and is gone (its process exited) before the one without starts.

The headline (``overall``) is the held-out suite (every set but the validation split); the
validation split is reported beside it as the in-distribution figure. Per category and per set:
the acceptance from vLLM's per-request figures with a bootstrap interval over prompts
(eagle3/evaluation/intervals.py); where vLLM gives none (CUDA vLLM 0.26), from its counters read
around each category's own call, with no interval ("n/a": eagle3/evaluation/breakdown.py); or,
with eval.prompts_apart, from the counters read around each prompt's own call: each request's own
figures, intervals as with vLLM's; or, with eval.step_figures, from the tokens each engine step adds
to each request (the batch concurrent as ever), intervals again.

The two engines' tokens/s ratio is the evaluation's own (its engines, its prompts, run as the
evaluation runs them), kept as ``eval_engines_tok_s_ratio``: not a serving figure. The serving
speed-up is the serving measurement's (eagle3/serving/speedup.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.config.engine import EngineOptions
from eagle3.data.render import ChatStyle
from eagle3.evaluation.breakdown import breakdown, counter_breakdown
from eagle3.evaluation.diagnostics.mismatch import MAX_REFERENCE_BYTES, cases_from, explain, weights_bytes
from eagle3.evaluation.engine_io import EngineRequest, PromptBatch
from eagle3.evaluation.export_info import ExportInfo
from eagle3.evaluation.figures import consistency_problems, figures_of, prompt_outcomes
from eagle3.evaluation.prompts import HELD_OUT, SOURCES, PromptSet
from eagle3.evaluation.report import AcceptanceReport
from eagle3.evaluation.subprocess_engine import run_engine_process
from eagle3.target_model.quantization import vllm_name

# draft tokens the target may append past max_new_tokens in its last step
_SPEC_SLACK = 8


def run_acceptance(
    info: ExportInfo,
    prompts: PromptSet,
    *,
    num_draft_tokens: int,
    max_new_tokens: int,
    engine: EngineOptions,
    work_dir: Path,
    baseline: bool = True,
    diagnostics: bool = False,
    style: ChatStyle = ChatStyle(),
    per_request: bool | None = None,
    prompts_apart: bool = False,
    step_figures: bool = False,
) -> AcceptanceReport:
    """vLLM's acceptance (with-head engine), speed and greedy agreement (with the baseline).
    diagnostics: also explain each greedy mismatch with an fp32 target forward (costly).
    style: how the deployment calls the chat template; the engines render each second turn with
    its template and arguments (its system prompt is in ``prompts``' turns already).
    per_request: EngineRequest.per_request (None: vLLM's per-request figures where it offers them).
    prompts_apart: EngineRequest.prompts_apart (eval.prompts_apart: without vLLM's per-request
    figures, each prompt a call of its own, its figures from the counters read around it).
    step_figures: EngineRequest.step_figures (eval.step_figures: without them, each request's
    figures rebuilt from the tokens of each engine step, the batch run concurrently)."""
    if num_draft_tokens < 1:
        raise ValueError(f"eval.num_draft_tokens must be >= 1, got {num_draft_tokens}")
    if max_new_tokens < 1:
        raise ValueError(f"eval.max_new_tokens must be >= 1, got {max_new_tokens}")
    sources = [s for s in SOURCES if prompts.by_source(s)]
    # a second turn holds the first, an answer of up to max_new_tokens, and the second question
    longest = max(max(len(p.token_ids), p.second_turn_tokens + max_new_tokens) for p in prompts.prompts)
    common: dict[str, Any] = dict(
        model=info.target,
        num_draft_tokens=num_draft_tokens,
        max_new_tokens=max_new_tokens,
        max_model_len=longest + max_new_tokens + num_draft_tokens + _SPEC_SLACK,
        batches=[_batch(s, prompts) for s in sources],
        options=engine,
        chat_template=style.template,
        chat_template_kwargs=dict(style.kwargs or {}),
        together=True,  # one generate() call for every set where vLLM gives per-request figures
        per_request=per_request,
        prompts_apart=prompts_apart,
        step_figures=step_figures,
    )
    with_head, wall_head = run_engine_process(
        EngineRequest(head=str(info.export_dir), **common), work_dir=work_dir, label="with-head"
    )
    without_head = wall_base = None
    if baseline:
        without_head, wall_base = run_engine_process(
            EngineRequest(head=None, **common), work_dir=work_dir, label="without-head"
        )
    report = _report(info, prompts, with_head, without_head, num_draft_tokens, max_new_tokens)
    report.engine = _engine_facts(
        engine, common["max_model_len"], work_dir, (with_head, wall_head), (without_head, wall_base)
    )
    report.consistency_problems += _together_problems(with_head)
    verdicts, notes = _explain_mismatches(
        info, prompts, with_head, without_head, bool(engine.trust_remote_code), diagnostics
    )
    report.consistency_problems += [f"greedy mismatch: {v['description']}" for v in verdicts if not v["near_tie"]]
    report.mismatch_verdicts = verdicts
    report.prompt_notes += notes
    _add_breakdown(report, prompts, with_head, num_draft_tokens)
    return report


def _report(
    info: ExportInfo, prompts: PromptSet, with_head, without_head, num_draft_tokens: int, max_new_tokens: int
) -> AcceptanceReport:
    """The figures per set and per prompt, and the headline: the held-out suite (the validation
    split alone when it is all there is); ``without_head``: None without a baseline."""

    def base_batch(name: str):
        return next(b for b in without_head.batches if b.name == name) if without_head is not None else None

    by_source, per_prompt, problems = {}, [], []
    for batch in with_head.batches:
        base = base_batch(batch.name)
        by_source[batch.name] = figures_of([batch], [base] if base is not None else None, num_draft_tokens)
        source_prompts = prompts.by_source(batch.name)
        per_prompt += prompt_outcomes(
            batch,
            base,
            [p.id for p in source_prompts],
            [len(p.token_ids) for p in source_prompts],
            [p.category for p in source_prompts],
        )
        problems += consistency_problems(batch, num_draft_tokens)
    head_names = {b.name for b in with_head.batches if b.name in HELD_OUT} or {b.name for b in with_head.batches}
    overall = figures_of(
        [b for b in with_head.batches if b.name in head_names],
        [b for b in without_head.batches if b.name in head_names] if without_head is not None else None,
        num_draft_tokens,
    )
    report = AcceptanceReport(
        export_dir=str(info.export_dir),
        target=info.target,
        num_draft_tokens=num_draft_tokens,
        max_new_tokens=max_new_tokens,
        overall=overall,
        by_source=by_source,
        prompt_counts=prompts.counts(),
        dataset_dir=None,
        prompt_notes=list(prompts.notes),
        skipped_too_long=dict(prompts.skipped_too_long),
        per_prompt=per_prompt,
        engine={},
        consistency_problems=problems,
        mismatch_verdicts=[],
    )
    report.headline_sets = [s for s in SOURCES if s in head_names]
    report.served = {
        b.name: list(zip((p.token_ids for p in prompts.by_source(b.name)), b.outputs)) for b in with_head.batches
    }
    return report


def _engine_facts(
    engine: EngineOptions, max_model_len: int, work_dir: Path, with_head: tuple, without_head: tuple
) -> dict[str, Any]:
    """How the engines ran: (result, process seconds) of each, the baseline's (None, None) when
    there was none."""
    result, wall = with_head
    facts: dict[str, Any] = {
        "vllm_version": result.vllm_version,
        "platform": result.platform,
        "enforce_eager": result.enforce_eager,
        "max_model_len": max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "tensor_parallel_size": engine.tensor_parallel_size,
        # the served target's quantization the engines ran (vLLM's name; null: the checkpoint as it
        # is, its own quantization_config included): a head is measured against one target
        "quantization": vllm_name(engine.quantization),
        "load_seconds_with_head": result.load_seconds,
        "process_seconds_with_head": wall,
        "logs": str(work_dir),
        # the sets ran in one generate() call: each set's tok/s is the call's
        "sets_run_together": result.together_counters is not None,
        "per_request_figures": result.per_request,
        # no per-request figures: each category ran as a call of its own (counters read around it)
        "categories_run_apart": any(b.category_counters for b in result.batches) and not result.prompts_apart,
        # no per-request figures from vLLM: each prompt ran as a call of its own (eval.prompts_apart)
        "prompts_run_apart": result.prompts_apart,
        # no per-request figures from vLLM: each request's rebuilt from each step's tokens (eval.step_figures)
        "figures_from_steps": result.step_figures,
    }
    base, base_wall = without_head
    if base is not None:
        facts.update(load_seconds_without_head=base.load_seconds, process_seconds_without_head=base_wall)
    return facts


def _add_breakdown(report: AcceptanceReport, prompts: PromptSet, with_head, num_draft_tokens: int) -> None:
    """Per category: from vLLM's per-request figures with intervals, else from the counters read
    around each category's own call, with the reason there is no interval."""
    if with_head.per_request:
        per_prompt = report.per_prompt
        report.by_category, report.intervals = breakdown(per_prompt, num_draft_tokens, report.headline_sets)
        if with_head.prompts_apart:
            report.figures_source = (
                f"vLLM {with_head.vllm_version} gives no per-request spec-decode figures: each prompt ran as a "
                "generate() call of its own, its figures from the engine counters read around that call "
                "(and between its two turns)"
            )
        elif with_head.step_figures:
            report.figures_source = (
                f"vLLM {with_head.vllm_version} gives no per-request spec-decode figures: the sets ran "
                "concurrently, driven step by step, each request's figures rebuilt from the tokens each "
                "engine step added to it (their sums checked against the engine counters)"
            )
        return
    categories = {b.name: [p.category for p in prompts.by_source(b.name)] for b in with_head.batches}
    report.by_category, report.intervals = counter_breakdown(
        with_head.batches, categories, num_draft_tokens, report.headline_sets
    )
    report.no_interval_reason = (
        f"vLLM {with_head.vllm_version} gives no per-request spec-decode figures: each category ran as a "
        "generate() call of its own, its figures from the engine counters read around it (a set's are the "
        "sum of its categories'); an interval needs each prompt's own figures"
    )


def _together_problems(result: Any) -> list[str]:
    """Sets run in one call: their counters, rebuilt from per-request histograms, must add up to
    the engine's counters around that call (two independent routes out of vLLM)."""
    whole = result.together_counters
    if whole is None:
        return []
    problems = []
    for key in ("drafts", "accepted_tokens"):
        got = sum((b.counters or {}).get(key, 0) for b in result.batches)
        if got != whole.get(key):
            problems.append(
                f"sets run together: {key} from per-request histograms {got} != from counters {whole.get(key)}"
            )
    return problems


def _batch(source: str, prompts: PromptSet) -> PromptBatch:
    items = prompts.by_source(source)
    second = [{"messages": p.messages, "question": p.second_turn} if p.second_turn else None for p in items]
    return PromptBatch(
        source,
        [p.token_ids for p in items],
        second_turns=second if any(second) else None,
        categories=[p.category for p in items],
    )


def _explain_mismatches(
    info: ExportInfo, prompts: PromptSet, with_head, without_head, trust_remote_code: bool, diagnostics: bool
):
    """fp32 verdicts on every greedy mismatch (a near tie, or a real problem), when asked for
    (eval.diagnostics) and the target is small enough for a transformers fp32 forward here."""
    if without_head is None:
        return [], []
    cases = []
    for wh, wo in zip(with_head.batches, without_head.batches):
        source = prompts.by_source(wh.name)
        cases += cases_from([p.token_ids for p in source], [p.id for p in source], wh.outputs, wo.outputs)
    if not cases:
        return [], []
    if not diagnostics:
        return [], [f"{len(cases)} greedy mismatches not explained (eval.diagnostics=true reruns them in fp32)"]
    size = weights_bytes(info.target)
    if size > MAX_REFERENCE_BYTES:
        return [], [
            f"{len(cases)} greedy mismatches not explained: the target ({size / 2**30:.1f} GiB) is "
            f"too large for the fp32 reference forward"
        ]
    verdicts = explain(info.target, cases, trust_remote_code=trust_remote_code)
    return [dict(v.__dict__, description=v.describe()) for v in verdicts], []
