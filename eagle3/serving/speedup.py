"""What a head buys in serving: the target alone against the target with the head in vLLM, at
several loads (concurrent requests) and numbers of draft tokens K, greedy, on held-out prompts.
`python evaluate.py export_dir=<dir> serving.measure=true` runs it (eagle3/stages/evaluate.py);
bench/serving_speedup.py is a CLI over the same functions that leaves the export as it is.

Prompts: the opening turns of the project's held-out suite (eagle3/evaluation/suite.py: the
broad prompts over the eight MT-bench categories, then math word problems and HumanEval, an
eighth each), the traffic a server gets; or a JSONL of chats (``{"messages": [...]}`` per line,
the opening turns served). Second turns are not served here (they need the target's answer
first: the acceptance evaluation asks them).

One engine per K (the target alone first), each in a process of its own
(eagle3/evaluation/engine.py: its GPU memory is gone before the next loads, counters start at
zero), built once with max_num_seqs = the largest load. Each load is run twice
(eagle3/serving/speedup_table.py):

- natural EOS, the headline: the load's requests queue up and c are in flight at every moment,
  a request starting as soon as one ends, each ending at EOS (or max_tokens), as a server under a
  steady load sees them. Its tokens/s and speed-up are the ones printed and advised.
- step-cost waves, ignore_eos: waves of exactly c requests (one generate() call each), all
  running to the same ``max_tokens``, so c are in flight from a wave's first step to its last
  (the result records each wave's size and vLLM's preemption count, which must be 0): the cost
  of a verify step at load c, the step costs the rule of eagle3/serving/advice.py predicts from.

Per (load, K): generated tokens / wall time, the speed-up over the target alone at that load,
acceptance length and per-position acceptance from vLLM's spec-decode counters, and the share of
requests whose output equals the target alone's token for token (bf16 kernels differ with the
batch shape, so on a GPU a few may part at a near tie of the logits). The best K per load at
natural EOS (0: none beats the target alone) is printed and, by the product command, written
into the export as serving.json (eagle3/serving/advice.py) together with the waves' step costs,
printed in the form of a class's costs in eagle3/serving/step_costs.yaml. Every work file is
written atomically: a run killed mid-write leaves no torn key file to stop the next one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from eagle3.config.cli import ServingConfig
from eagle3.config.engine import EngineOptions
from eagle3.draft.export_files import SERVING_WORK
from eagle3.evaluation.engine_io import EngineRequest, EngineResult, PromptBatch
from eagle3.evaluation.subprocess_engine import EngineRunError
from eagle3.serving import advice as advice_rules
from eagle3.serving.serve_command import serving_lines
from eagle3.serving.speedup_table import (
    NATURAL_LABEL,
    WAVES_LABEL,
    natural_name,
    print_table,
    summarise,
    summarise_natural,
    table_step_costs,
    wave_name,
)
from eagle3.util.atomic import write_text

__all__ = ["measure_serving", "step_costs_in_work_dir", "summarise", "summarise_natural", "table_step_costs"]


def wave_requests(n_prompts: int, load: int, min_waves: int) -> list[int]:
    """Prompt indices for a load of c: every prompt at least once and ``min_waves`` waves at
    least, rounded up to whole waves of c (prompts repeat in turn to fill them)."""
    n = max(n_prompts, min_waves * load)
    n = -(-n // load) * load
    return [i % n_prompts for i in range(n)]


def engine_request(
    target: str,
    head: str | None,
    k: int,
    prompts: list[list[int]],
    load_prompts: dict[int, list[int]],
    serving: ServingConfig,
    engine: EngineOptions,
) -> EngineRequest:
    largest = max(load_prompts)
    return EngineRequest(
        model=target,
        head=head if k else None,
        num_draft_tokens=k,
        max_new_tokens=serving.max_new_tokens,
        max_model_len=serving.max_model_len,
        batches=[
            PromptBatch(wave_name(c), [prompts[i] for i in idx], wave_size=c, ignore_eos=True)
            for c, idx in load_prompts.items()
        ]
        + [PromptBatch(natural_name(c), [prompts[i] for i in idx], concurrency=c) for c, idx in load_prompts.items()],
        # one engine for every load: it must admit the largest wave at once
        options=dataclasses.replace(engine, max_num_seqs=largest),
        warmup_prompts=largest,
    )


def engine_key(request: EngineRequest) -> dict[str, Any]:
    """What makes two engine runs the same: the request and the head's weights (a retrained head
    exported to the same directory is a different engine). options.timeout_s is left out: how long
    the caller waits for an engine does not change what the engine measures."""
    sha = advice_rules.head_sha256(request.head) if request.head else None
    raw = json.loads(request.to_json())
    del raw["options"]["timeout_s"]
    # options unset keep the keys of the engines run before them
    if raw["options"].get("quantization") is None:
        raw["options"].pop("quantization", None)
    if not raw.get("chat_template_kwargs"):
        raw.pop("chat_template_kwargs", None)
    return {"request": raw, "head_sha256": sha}


def finished_engine(work: Path, label: str, request: EngineRequest) -> EngineResult | None:
    """The result an earlier run of exactly this engine left in ``work``, or None: an engine start
    costs minutes on a GPU, so a measurement cut off by a time limit goes on where it stopped."""
    key_file, res_file = work / f"engine-{label}.key.json", work / f"engine-{label}.result.json"
    if not (key_file.is_file() and res_file.is_file()):
        return None
    if json.loads(key_file.read_text()) != engine_key(request):
        return None
    return EngineResult.from_json(res_file.read_text())


def step_costs_in_work_dir(work: Path) -> dict[int, dict[int, float]]:
    """c(K, load) from the engines that finished in a measurement's work dir, starting none: a
    measurement cut off part-way (a job or device-time limit) still gives the step costs of the
    K it reached. The target alone (engine-k0) must be there, and every engine must have run the
    same prompts, loads and length as it (their key files say)."""
    keys = {int(f.name[len("engine-k") : -len(".key.json")]): f for f in work.glob("engine-k*.key.json")}
    if 0 not in keys or not (work / "engine-k0.result.json").is_file():
        raise ValueError(f"{work}: no finished engine-k0 (the target alone): nothing to compare with")
    base_req = json.loads(keys[0].read_text())["request"]
    base_req["batches"] = [b for b in base_req["batches"] if b.get("wave_size")]  # the step-cost waves
    with_head: dict[int, EngineResult] = {}
    for k, key_file in sorted(keys.items()):
        res_file = work / f"engine-k{k}.result.json"
        if k == 0 or not res_file.is_file():
            continue
        req = json.loads(key_file.read_text())["request"]
        req["batches"] = [b for b in req["batches"] if b.get("wave_size")]
        for field_name in ("model", "batches", "max_new_tokens"):
            if req[field_name] != base_req[field_name]:
                raise ValueError(
                    f"{key_file}: {field_name}: expected the target alone's (engine-k0.key.json), got another: "
                    "these engines belong to different measurements"
                )
        with_head[k] = EngineResult.from_json(res_file.read_text())
    # the prompts per load as measure_serving made them: each request's prompt, numbered in order of first use
    numbers: dict[tuple[int, ...], int] = {}
    load_prompts = {
        int(b["wave_size"]): [numbers.setdefault(tuple(p), len(numbers)) for p in b["prompts"]]
        for b in base_req["batches"]
    }
    alone = EngineResult.from_json((work / "engine-k0.result.json").read_text())
    return table_step_costs(summarise(alone, with_head, load_prompts, int(base_req["max_new_tokens"])))[1]


def jsonl_prompts(
    path: str,
    n: int,
    tokenizer: Any,
    max_tokens: int,
    template_kwargs: dict[str, Any] | None = None,
    system_prompt: str | None = None,
) -> tuple[list[list[int]], dict[str, int]]:
    """The opening turns (a leading system turn, then the first user turn) of chat lines, rendered
    as the deployment calls the template (``template_kwargs``, ``system_prompt``: the dataset's)."""
    from eagle3.data.render import with_system_prompt
    from eagle3.evaluation.prompts import render_prompt

    out: list[list[int]] = []
    for line in Path(path).read_text().splitlines():
        if len(out) == n:
            break
        if not line.strip():
            continue
        messages = json.loads(line)["messages"]
        opening = messages[: 2 if messages[0]["role"] == "system" else 1]
        ids = render_prompt(tokenizer, with_system_prompt(opening, system_prompt), None, template_kwargs)
        if len(ids) <= max_tokens:
            out.append(ids)
    return out, {"jsonl": len(out)}


def held_out(
    target: str, dataset_dir: str | Path | None, serving: ServingConfig, trust_remote_code: bool = False
) -> tuple[list[list[int]], dict[str, int]]:
    """The prompts (token ids) and their counts by source: the held-out suite's opening turns
    (``dataset_dir``'s prompts are not read: the validation split is the training data's
    distribution, not the traffic a server gets; only how it called the chat template is)."""
    from transformers import AutoTokenizer

    from eagle3.evaluation.prompts import chat_style, heldout_prompts

    tok = AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)
    max_prompt = serving.max_model_len - serving.max_new_tokens - 8
    template_kwargs, system_prompt = chat_style(dataset_dir)
    if serving.prompts_jsonl:
        return jsonl_prompts(serving.prompts_jsonl, serving.prompts, tok, max_prompt, template_kwargs, system_prompt)
    # the held-out suite: the broad prompts, then an eighth each of math word problems and HumanEval
    eighth = serving.prompts // 8
    suite, math = serving.prompts - 2 * eighth, eighth
    held = heldout_prompts(
        None,
        eighth,
        eighth,
        tok,
        max_prompt_tokens=max_prompt,
        suite=suite,
        math=math,
        template_kwargs=template_kwargs,
        system_prompt=system_prompt,
    )
    return [p.token_ids for p in held.prompts], {k: v for k, v in held.counts().items() if v}


def run_engines(
    target: str,
    head: str,
    prompts: list[list[int]],
    load_prompts: dict[int, list[int]],
    serving: ServingConfig,
    engine: EngineOptions,
    work: Path,
) -> tuple[EngineResult, dict[int, EngineResult], dict[int, str]]:
    """The target alone and one engine per K, each reused from ``work`` where it already ran.
    Engines cost minutes on a GPU, so one K that fails (out of memory at K=5, a timeout) or that
    ``serving.max_minutes`` leaves no time for does not cost the others: it is returned with its
    reason, beside the results of the rest. Without the target alone there is nothing to compare
    with: its failure raises."""
    from eagle3.evaluation.subprocess_engine import run_engine_process

    # the engine runs as `python -m eagle3.evaluation.engine`: it must find eagle3 from any cwd
    root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    t0, slowest = time.perf_counter(), 0.0

    def one(k: int) -> EngineResult | str:
        nonlocal slowest
        request = engine_request(target, head, k, prompts, load_prompts, serving, engine)
        reused = finished_engine(work, f"k{k}", request)
        if reused is not None:  # a measurement stopped part-way and run again with the same work dir
            print(f"K={k}: result of an earlier run of the same request in {work}", flush=True)
            # what it took then, process start and teardown aside: the estimate for the next
            slowest = max(slowest, reused.load_seconds + reused.warmup_seconds + sum(b.seconds for b in reused.batches))
            return reused
        if serving.max_minutes is not None and k:
            left = serving.max_minutes * 60 - (time.perf_counter() - t0)
            if slowest > left:
                reason = (
                    f"not started: {left:.0f} s left of serving.max_minutes={serving.max_minutes:g}, "
                    f"an engine takes up to {slowest:.0f} s here"
                )
                print(f"K={k}: {reason}", flush=True)
                return reason
        try:
            result, wall = run_engine_process(request, work, f"k{k}")
        except EngineRunError as e:
            if not k:
                raise
            print(f"K={k}: {e}", flush=True)
            return f"failed: {str(e).splitlines()[0]}"
        slowest = max(slowest, wall)
        write_text(work / f"engine-k{k}.key.json", json.dumps(engine_key(request)))
        print(f"K={k}: engine up in {result.load_seconds:.0f} s, {wall:.0f} s in all", flush=True)
        return result

    alone = one(0)
    assert isinstance(alone, EngineResult)
    with_head: dict[int, EngineResult] = {}
    missing: dict[int, str] = {}
    for k in serving.draft_tokens:
        res = one(k)
        if isinstance(res, EngineResult):
            with_head[k] = res
        else:
            missing[k] = res
    return alone, with_head, missing


def measure_serving(
    export_dir: str | Path,
    target: str,
    dataset_dir: str | Path | None,
    serving: ServingConfig,
    engine: EngineOptions,
    out: str | Path,
    prompts_for: Callable[..., tuple[list[list[int]], dict[str, int]]] = held_out,
) -> tuple[dict[str, Any], advice_rules.ServingAdvice]:
    """Measure, print the table and the step costs, write the result JSON to ``out``; the
    advice for the export (serving.json), written there where ``serving.write_advice``."""
    prompts, counts = prompts_for(target, dataset_dir, serving, bool(engine.trust_remote_code))
    if not prompts:
        raise ValueError("no held-out prompts")
    loads = [int(x) for x in serving.loads]
    load_prompts = {c: wave_requests(len(prompts), c, serving.min_waves) for c in loads}
    work = Path(serving.work_dir) if serving.work_dir else Path(out).parent / SERVING_WORK
    work.mkdir(parents=True, exist_ok=True)
    alone, with_head, missing = run_engines(target, str(export_dir), prompts, load_prompts, serving, engine, work)
    if not with_head:
        raise EngineRunError(
            "no engine with the head finished: "
            + "; ".join(f"K={k} {why}" for k, why in missing.items())
            + f" (the target alone's result is kept in {work}: a rerun with serving.work_dir={work} reuses it)"
        )
    ks = sorted(with_head)
    waves = summarise(alone, with_head, load_prompts, serving.max_new_tokens)
    print_table(waves, WAVES_LABEL, verdicts=False)
    costs = table_step_costs(waves)[1]
    print(f"step costs c(K, load) in plain decode steps (the costs form of eagle3/serving/step_costs.yaml): {costs}")
    table = summarise_natural(alone, with_head, load_prompts)
    print_table(table, NATURAL_LABEL)
    speedups = table_step_costs(table)[0]
    device = f"{alone.platform}, vLLM {alone.vllm_version}, eager={alone.enforce_eager}"
    result = {
        "device": device,
        "prompts": counts,
        "turns": "first turns only (a second turn needs the target's answer first)",
        "loads": loads,
        "draft_tokens": ks,
        "not_measured": {str(k): why for k, why in missing.items()},
        "max_new_tokens": serving.max_new_tokens,
        "table_label": NATURAL_LABEL,
        "table": table,
        "step_cost_waves": {"label": WAVES_LABEL, "table": waves},
        "step_costs": costs,
    }
    write_text(out, json.dumps(result, indent=2))
    advice = advice_rules.from_measurements(
        speedups, device=device, step_costs=costs, prompts=counts, speedups_from=NATURAL_LABEL
    )
    advice.head_sha256 = advice_rules.head_sha256(export_dir)
    if serving.write_advice:
        print(f"wrote {advice.write(export_dir)}")
    lines = serving_lines(
        export_dir, target, max(ks), advice, engine.tensor_parallel_size, bool(engine.trust_remote_code)
    )
    for line in lines:
        print(line)
    failed = {k: why for k, why in missing.items() if why.startswith("failed")}
    if failed:  # the table and the advice are written; the caller still learns that K went missing
        raise EngineRunError(
            f"measured K={ks} only: "
            + "; ".join(f"K={k} {why}" for k, why in failed.items())
            + f" (finished engines are kept in {work}: a rerun with serving.work_dir={work} starts only the missing ones)"
        )
    if missing:
        print(f"not measured: {', '.join(f'K={k} ({why})' for k, why in missing.items())}")
    return result, advice
