"""What a head buys in serving: the target alone against the target with the head in vLLM,
at several loads (concurrent requests) and numbers of draft tokens K, greedy, on held-out
prompts (the dataset's validation split and HumanEval, as `python -m eagle3.evaluate` takes them).

    python bench/serving_speedup.py --export-dir DIR --verifier DIR [--dataset-dir DIR] \
        [--loads 1,8,32,64] [--draft-tokens 1,2,3,5] [--prompts 32] [--max-new-tokens 128] \
        --out serving.json [--write-advice]

One engine per K (K = 0: the target alone), each in a process of its own (the GPU memory of
one is gone before the next loads). A load of c runs the requests in waves of exactly c, all
with ``ignore_eos`` and the same ``max_tokens``: every request of a wave runs to the same
length, so c requests are in flight from its first step to its last. Per (load, K): generated
tokens/s over the waves' wall time, speed-up over the target alone at that load, acceptance
length and per-position acceptance from vLLM's spec-decode counters around the load, and the
share of requests whose greedy output equals the target alone's token for token. The best K
per load (0 where no K beats the target alone) is printed and, with --write-advice, written
into the export as serving.json (eagle3/evaluation/serving_advice.py), with the measured step
costs that let the rule advise heads measured only for acceptance.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP_TOKENS = 16


def worker(request_file: str, result_file: str) -> None:
    """One engine: every load's waves, timed, with the counters around each load."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3.evaluation.counters import SpecDecodeCounters

    req = json.loads(Path(request_file).read_text())
    k = int(req["num_draft_tokens"])
    kwargs = dict(
        model=req["verifier"],
        tokenizer=req["verifier"],
        max_model_len=req["max_model_len"],
        max_num_seqs=max(req["loads"]),
        gpu_memory_utilization=req["gpu_memory_utilization"],
        enable_prefix_caching=False,  # every request computes its whole prompt, with or without the head
        disable_log_stats=False,
        seed=0,
    )
    if k:
        kwargs["speculative_config"] = {"model": req["export_dir"], "method": "eagle3", "num_speculative_tokens": k}
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=req["max_new_tokens"], ignore_eos=True)
    prompts = req["prompts"]
    llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts[: max(req["loads"])]],
        SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )

    def counters() -> SpecDecodeCounters | None:
        return SpecDecodeCounters.from_metrics(llm.get_metrics(), k) if k else None

    out: dict = {"num_draft_tokens": k, "load_seconds": load_s, "loads": {}}
    for load in req["loads"]:
        n = max(req["requests_min"], req["waves_min"] * load)
        requests = [prompts[i % len(prompts)] for i in range(n - n % load)]
        before = counters()
        outputs: list[list[int]] = []
        wave_sizes = []
        t0 = time.perf_counter()
        for start in range(0, len(requests), load):
            wave = requests[start : start + load]
            wave_sizes.append(len(wave))
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in wave], params, use_tqdm=False)
            outputs += [list(o.outputs[0].token_ids) for o in outs]
        seconds = time.perf_counter() - t0
        after = counters()
        row = {
            "requests": len(requests),
            "wave_sizes": sorted(set(wave_sizes)),
            "seconds": seconds,
            "generated_tokens": sum(len(o) for o in outputs),
            "outputs": outputs,
        }
        if before is not None and after is not None:
            row["counters"] = (after - before).to_dict()
        out["loads"][str(load)] = row
        print(f"K={k} load={load}: {row['generated_tokens'] / seconds:,.0f} tok/s", flush=True)
    Path(result_file).write_text(json.dumps(out))


def run_engine(req: dict, work: Path, label: str) -> dict:
    from eagle3.evaluation.subprocess_engine import engine_env

    req_file, res_file, log = work / f"{label}.json", work / f"{label}.result.json", work / f"{label}.log"
    req_file.write_text(json.dumps(req))
    with open(log, "w") as f:
        rc = subprocess.run(
            [sys.executable, __file__, "--worker", str(req_file), str(res_file)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=engine_env(req["cpu_kvcache_space_gb"]),
        ).returncode
    if rc != 0 or not res_file.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"engine {label} failed (exit {rc}); last lines of {log}:\n{tail}")
    return json.loads(res_file.read_text())


def summarise(alone: dict, with_head: dict[int, dict], loads: list[int]) -> dict:
    """Per load and K: tok/s, speed-up, acceptance, output equality; the best K per load."""
    table: dict = {}
    for load in loads:
        base = alone["loads"][str(load)]
        base_tps = base["generated_tokens"] / base["seconds"]
        row: dict = {"target_alone_tok_s": base_tps, "by_k": {}}
        for k, res in sorted(with_head.items()):
            r = res["loads"][str(load)]
            c = r["counters"]
            drafts = max(1, c["drafts"])
            equal = sum(a == b for a, b in zip(r["outputs"], base["outputs"])) / max(1, len(r["outputs"]))
            tps = r["generated_tokens"] / r["seconds"]
            row["by_k"][k] = {
                "tok_s": tps,
                "speedup": tps / base_tps,
                "acceptance_length": 1 + c["accepted_tokens"] / drafts,
                "per_position": [a / drafts for a in c["accepted_per_position"]],
                "outputs_equal": equal,
                "requests": r["requests"],
                "wave_sizes": r["wave_sizes"],
            }
        best_k, best = max(((k, v["speedup"]) for k, v in row["by_k"].items()), key=lambda kv: kv[1])
        row["best_k"] = best_k if best > 1.0 else 0
        row["best_speedup"] = max(best, 1.0)
        table[load] = row
    return table


def print_table(table: dict) -> None:
    print("| load | target alone tok/s | K | with head tok/s | speed-up | acceptance | per position | outputs equal |")
    print("|---|---|---|---|---|---|---|---|")
    for load, row in table.items():
        for k, v in row["by_k"].items():
            pos = " / ".join(f"{p:.3f}" for p in v["per_position"])
            print(
                f"| {load} | {row['target_alone_tok_s']:,.1f} | {k} | {v['tok_s']:,.1f} | {v['speedup']:.2f}x | "
                f"{v['acceptance_length']:.2f} | {pos} | {v['outputs_equal']:.2f} |"
            )
    for load, row in table.items():
        advice = f"K={row['best_k']} ({row['best_speedup']:.2f}x)" if row["best_k"] else "without the head"
        print(f"best at {load} concurrent requests: {advice}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export-dir", required=True)
    ap.add_argument("--verifier", required=True)
    ap.add_argument("--dataset-dir", default=None, help="its validation split's first turns are the prompts")
    ap.add_argument("--loads", default="1,8,32,64")
    ap.add_argument("--draft-tokens", default="1,2,3,5")
    ap.add_argument("--prompts", type=int, default=48, help="held-out prompts (a third HumanEval)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--requests-min", type=int, default=32, help="requests per load at least")
    ap.add_argument("--waves-min", type=int, default=4, help="waves per load at least")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--cpu-kvcache-space-gb", type=int, default=4)
    ap.add_argument("--out", required=True)
    ap.add_argument("--write-advice", action="store_true", help="write the export's serving.json")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from eagle3.evaluation import serving_advice
    from eagle3.evaluation.prompts import heldout_prompts

    tok = AutoTokenizer.from_pretrained(args.verifier)
    held = heldout_prompts(
        args.dataset_dir,
        args.prompts,
        args.prompts // 3,
        tok,
        max_prompt_tokens=args.max_model_len - args.max_new_tokens - 8,
    )
    loads = [int(x) for x in args.loads.split(",")]
    ks = [int(x) for x in args.draft_tokens.split(",")]
    base_req = {
        "verifier": args.verifier,
        "export_dir": args.export_dir,
        "max_model_len": args.max_model_len,
        "max_new_tokens": args.max_new_tokens,
        "loads": loads,
        "prompts": [p.token_ids for p in held.prompts],
        "requests_min": args.requests_min,
        "waves_min": args.waves_min,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "cpu_kvcache_space_gb": args.cpu_kvcache_space_gb,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        alone = run_engine({**base_req, "num_draft_tokens": 0}, work, "k0")
        with_head = {k: run_engine({**base_req, "num_draft_tokens": k}, work, f"k{k}") for k in ks}
    table = summarise(alone, with_head, loads)
    print_table(table)
    speedups = {load: {k: v["speedup"] for k, v in row["by_k"].items()} for load, row in table.items()}
    tokens_per_step = {k: table[loads[0]]["by_k"][k]["acceptance_length"] for k in ks}
    result = {
        "prompts": held.counts(),
        "loads": loads,
        "draft_tokens": ks,
        "max_new_tokens": args.max_new_tokens,
        "load_seconds": {str(k): r["load_seconds"] for k, r in {0: alone, **with_head}.items()},
        "table": table,
        "step_costs": serving_advice.step_costs(speedups, tokens_per_step),
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    advice = serving_advice.from_measurements(speedups)
    print(advice.summary_line())
    if args.write_advice:
        print(f"wrote {advice.write(args.export_dir)}")


if __name__ == "__main__":
    main()
