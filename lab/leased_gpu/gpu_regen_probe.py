"""How fast HFRegenerator answers on this machine, before a real run spends its minutes:
a SmolLM2-shaped random Llama (random weights never stop early, so every answer runs the
full --max-tokens) answers --n synthetic prompts in batches of --batch.

    python lab/leased_gpu/gpu_regen_probe.py --tok .gpu/tok --n 2048 --batch 1024 --max-tokens 64 \
        [--engine fast generate] [--static]

--engine: which HFRegenerator engines to time on the same prompts, in order: fast (the
default: eagle3.target_model.generate.fast_decode) and/or generate (transformers generate, dynamic cache);
each engine's answers are compared with the first engine's. --static: also time the
static-cache generate engine (data.regen_static_cache=true) the same way.

Random weights never stop early and synthetic prompts are short, so they overstate what a
real run gets (17,382 tok/s probed vs ~5,200 on real ShareGPT first turns, docs/changelog.md). With
the real target and real prompts the probe answers the question a run needs:

    python lab/leased_gpu/gpu_regen_probe.py --tok .gpu/tok --model-dir /tmp/cache/targets/<smollm2 dir> \
        --prompts /tmp/sharegpt.jsonl --n 4096 --batch 2048 --max-tokens 256 [--engine fast generate]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from eagle3.data.conversation import Conversation
from eagle3.target_model.generate.common import AnswerSettings
from eagle3.target_model.generate.hf_engine import HFRegenerator


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", required=True)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--static", action="store_true", help="also time the static-cache generate engine")
    ap.add_argument(
        "--engine",
        nargs="+",
        choices=("fast", "generate"),
        default=["fast"],
        help="engines to time, in order; answers are compared with the first's",
    )
    ap.add_argument("--dtype", default="bfloat16", help="float32: answers equal across engines, bf16 near ties flip")
    ap.add_argument("--model-dir", default=None, help="a real HF model dir (default: random SmolLM2-shaped)")
    ap.add_argument("--prompts", default=None, help="a chat JSONL: its first --n conversations' opening turns")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tok)
    cfg = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=len(tok),
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    d = tempfile.mkdtemp(prefix="regen-probe-")
    if args.target_dir:
        d = args.target_dir
    else:
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d)
        tok.save_pretrained(d)
    if args.prompts:
        from eagle3.data.loaders import iter_conversations

        convs = []
        for conv in iter_conversations("jsonl", args.prompts):
            first = next((m for m in conv.messages if m["role"] == "user"), None)
            if first is not None:
                convs.append(Conversation(id=conv.id, messages=[first]))
            if len(convs) >= args.n:
                break
    else:
        rng = random.Random(0)
        words = "the of and to a in is you that it for what how can write explain code python list".split()
        convs = [
            Conversation(
                id=f"p{i}",
                messages=[{"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(5, 300)))}],
            )
            for i in range(args.n)
        ]
    cache_root = tempfile.mkdtemp(prefix="regen-probe-cache-")  # never inside a real model dir
    engines = list(dict.fromkeys(args.engine + (["static"] if args.static else [])))
    answers = {}
    for engine in engines:
        regen = HFRegenerator(
            d,
            f"{cache_root}/{engine}",
            answers=AnswerSettings(max_tokens=args.max_tokens, max_model_len=1024),
            gen_batch_size=args.batch,
            static_cache=engine == "static",
            fast_decode=engine == "fast",
            dtype=args.dtype,
        )
        t0 = time.perf_counter()
        first = regen(convs[: args.batch])  # first batch: load, padding check, warm-up (compile)
        t1 = time.perf_counter()
        made = regen.new_tokens
        rest = regen(convs[args.batch :])
        t2 = time.perf_counter()
        answers[engine] = [c.messages for c in first + rest]
        n, new_tokens = len(convs) - args.batch, regen.new_tokens - made
        steps = max(1, -(-n // args.batch) * args.max_tokens)
        same = sum(a == b for a, b in zip(answers[engine], answers[engines[0]]))
        how = "fast decode" if regen._use_fast() else f"generate, attention {regen._load().config._attn_implementation}"
        print(
            f"{engine} ({how}): first batch (load + check + warm-up) {t1 - t0:.1f} s; then {n} answers, "
            f"{new_tokens:,} new tokens in {t2 - t1:.1f} s = {new_tokens / max(1e-9, t2 - t1):,.0f} tok/s, "
            f"{1000 * (t2 - t1) / steps:.1f} ms per decode step at batch {args.batch} (if every answer ran "
            f"--max-tokens); {same} / {len(answers[engine])} answers equal {engines[0]}'s",
            flush=True,
        )
        regen.close()


if __name__ == "__main__":
    main()
