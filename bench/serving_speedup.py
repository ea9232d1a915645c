"""What a head buys in serving, as a bench: the measurement of eagle3/serving/speedup.py
(the target alone against the target with the head in vLLM, per load and number of draft tokens K,
greedy, held-out prompts) with the target and prompts given by hand. It prints the table, the
step costs and the best K per load, and writes the result JSON; it leaves the export as it is.

    python bench/serving_speedup.py --export-dir DIR --target DIR [--dataset-dir DIR] \
        [--prompts-jsonl FILE] [--loads 1,8,32,64] [--draft-tokens 1,2,3,5] [--prompts 64] \
        [--max-new-tokens 128] --out results.json

Prompts: the opening turns of the project's held-out suite (the broad prompts over the eight
MT-bench categories, an eighth each of math word problems and HumanEval), or a JSONL of chats
(``{"messages": [...]}`` per line). Each load runs at natural EOS from a queue kept at that many
requests (the table and the best K printed) and as step-cost waves with ignore_eos (the step
costs).

The step costs of a measurement cut off part-way, from the engines that finished in its work
dir (no engine starts):

    python bench/serving_speedup.py --costs-from WORK_DIR

To write the advice into the export (serving.json, which train.py and export.py print), run the
product command instead:

    python evaluate.py export_dir=DIR serving.measure=true serving.loads=[1,8,32,64] serving.draft_tokens=[1,2,3,5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import ints  # beside this file; puts the checkout on sys.path

from eagle3.config.cli import ServingConfig
from eagle3.config.engine import EngineOptions
from eagle3.evaluation.subprocess_engine import EngineRunError
from eagle3.serving.speedup import measure_serving, step_costs_in_work_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--costs-from", default=None, help="a work dir: print the step costs of its finished engines")
    ap.add_argument("--export-dir")
    ap.add_argument("--target", help="the target's directory or hub id")
    ap.add_argument(
        "--dataset-dir", default=None, help="the head's dataset (the held-out suite is served, not its split)"
    )
    ap.add_argument("--prompts-jsonl", default=None, help="chat lines instead of the held-out suite")
    ap.add_argument("--loads", default="1,8,32,64")
    ap.add_argument("--draft-tokens", default="1,2,3,5")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--min-waves", type=int, default=2, help="waves per load at least")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--cpu-kvcache-space-gb", type=int, default=4)
    ap.add_argument(
        "--load-format",
        default="auto",
        help="dummy: random weights from the target's config.json (step costs without the weights)",
    )
    ap.add_argument("--timeout-s", type=int, default=1800, help="per engine")
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no engine that would end past this (the table: the K that ran)",
    )
    ap.add_argument(
        "--work-dir", default=None, help="engine requests, results and logs; a rerun reuses finished engines"
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.costs_from:
        try:
            costs = step_costs_in_work_dir(Path(args.costs_from))
        except ValueError as e:
            sys.exit(str(e))
        print(f"step costs c(K, load) of the finished engines in {args.costs_from}: {costs}")
        return
    missing = [f"--{a.replace('_', '-')}" for a in ("export_dir", "target", "out") if not getattr(args, a)]
    if missing:
        ap.error(f"the measurement needs {', '.join(missing)}")
    serving = ServingConfig(
        measure=True,
        loads=ints(args.loads),
        draft_tokens=ints(args.draft_tokens),
        prompts=args.prompts,
        prompts_jsonl=args.prompts_jsonl,
        max_new_tokens=args.max_new_tokens,
        max_model_len=args.max_model_len,
        min_waves=args.min_waves,
        work_dir=args.work_dir,
        max_minutes=args.max_minutes,
        write_advice=False,  # the export is the product's: python evaluate.py ... serving.measure=true
    )
    engine = EngineOptions(
        gpu_memory_utilization=args.gpu_memory_utilization,
        cpu_kvcache_space_gb=args.cpu_kvcache_space_gb,
        timeout_s=args.timeout_s,
        load_format=args.load_format,
    )
    try:
        measure_serving(args.export_dir, args.target, args.dataset_dir, serving, engine, args.out)
    except (ValueError, EngineRunError) as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
