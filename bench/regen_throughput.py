"""Regeneration (data.regenerate=true) answers/s by engine on the same first user turns:
vLLM against transformers' fast decode (eagle3.target_model.generate), the engines extract.py
picks between with data.regen_backend.

    python bench/regen_throughput.py --model-dir DIR --chat sharegpt.jsonl --n 2048 \
        --max-tokens 256 [--engines vllm hf] [--hf-batch 2048] [--num-answers 2 --temperature 0.7] --out regen.json

Each engine answers the first user turn of the same --n conversations greedily, from an
empty cache of its own (nothing is read back from an earlier run), and the answers of the
later engines are compared with the first one's (exact text: greedy decoding differs only
where bf16 kernels break a near-tie). With --num-answers n (sampled, --temperature > 0) each
conversation is answered n times (data.regen_num_answers): answers/s counts every answer.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from harness import write_json  # beside this file; puts the checkout on sys.path

from eagle3.data.loaders import load_conversations
from eagle3.target_model.generate.common import AnswerSettings
from eagle3.target_model.generate.dispatch import make_regenerator

WARMUP = 8  # conversations answered first, while the engine loads (not in the rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--chat", required=True)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--engines", nargs="+", default=["vllm", "hf"])
    ap.add_argument("--hf-batch", type=int, default=2048, help="fast decode's batch (data.regen_batch_size)")
    ap.add_argument("--num-answers", type=int, default=1, help="answers per conversation (data.regen_num_answers)")
    ap.add_argument("--temperature", type=float, default=0.0, help="data.regen_temperature (> 0 for several answers)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    convs = load_conversations("jsonl", args.chat, limit=args.n + WARMUP).conversations
    results: dict = {
        "n": len(convs) - WARMUP,
        "max_tokens": args.max_tokens,
        "num_answers": args.num_answers,
        "temperature": args.temperature,
        "engines": {},
    }
    first_answers: list[str] | None = None
    for engine in args.engines:
        with tempfile.TemporaryDirectory() as cache:
            regen = make_regenerator(
                engine,
                args.target_dir,
                cache,
                answers=AnswerSettings(
                    temperature=args.temperature,
                    max_tokens=args.max_tokens,
                    seed=0,
                    max_model_len=args.max_model_len,
                    max_turns=1,
                    chat_template=None,
                ),
                num_answers=args.num_answers,
                gen_batch_size=args.hf_batch,
                static_cache=False,
                gpu_memory_utilization=0.5,
            )
            # the engine loads on its first call: a few conversations first, timed apart
            t0 = time.perf_counter()
            answered = regen(convs[:WARMUP])
            startup = time.perf_counter() - t0
            tokens_before = regen.new_tokens
            t0 = time.perf_counter()
            answered += regen(convs[WARMUP:])
            seconds = time.perf_counter() - t0
            new_tokens = regen.new_tokens - tokens_before
            regen.close()
        answers = [next((m["content"] for m in c.messages if m["role"] == "assistant"), "") for c in answered]
        row = {
            "startup_seconds": startup,
            "seconds": seconds,
            "answers_per_s": (len(convs) - WARMUP) * args.num_answers / seconds,
            "new_tokens": new_tokens,
            "new_tokens_per_s": new_tokens / seconds,
        }
        if first_answers is None:
            first_answers = answers
        else:
            row["answers_equal_to_first_engine"] = sum(a == b for a, b in zip(answers, first_answers)) / len(answers)
        results["engines"][engine] = row
        print(engine, json.dumps(row), flush=True)
    write_json(args.out, results, echo=True)


if __name__ == "__main__":
    main()
