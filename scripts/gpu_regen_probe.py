"""How fast HFRegenerator answers on this machine, before a real run spends its minutes:
a SmolLM2-shaped random Llama (random weights never stop early, so every answer runs the
full --max-tokens) answers --n synthetic prompts in batches of --batch.

    python scripts/gpu_regen_probe.py --tok .gpu/tok --n 2048 --batch 1024 --max-tokens 64 [--static]

--static: also time the static-cache engine (data.regen_static_cache=true) on the same
prompts and check its answers equal the dynamic cache's (random weights, greedy).

Random weights never stop early and synthetic prompts are short, so they overstate what a
real run gets (session 3: 17,382 tok/s probed vs ~5,200 on real ShareGPT first turns). With
the real target and real prompts the probe answers the question a run needs:

    python scripts/gpu_regen_probe.py --tok .gpu/tok --model-dir /tmp/cache/targets/<smollm2 dir> \
        --prompts /tmp/sharegpt.jsonl --n 4096 --batch 2048 --max-tokens 256 [--static]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from eagle3.data.conversation import Conversation
from eagle3.data.regenerate import HFRegenerator


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", required=True)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--static", action="store_true")
    ap.add_argument("--model-dir", default=None, help="a real HF model dir (default: random SmolLM2-shaped)")
    ap.add_argument("--prompts", default=None, help="a chat JSONL: its first --n conversations' opening turns")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tok)
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=len(tok), tie_word_embeddings=True,
                      max_position_embeddings=8192, rope_theta=100000.0, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    d = tempfile.mkdtemp(prefix="regen-probe-")
    if args.model_dir:
        d = args.model_dir
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
        convs = [Conversation(id=f"p{i}", messages=[{"role": "user", "content": " ".join(
            rng.choice(words) for _ in range(rng.randint(5, 300)))}]) for i in range(args.n)]
    cache_root = tempfile.mkdtemp(prefix="regen-probe-cache-")  # never inside a real model dir
    answers = {}
    for static in ([False, True] if args.static else [False]):
        regen = HFRegenerator(d, f"{cache_root}/{'static' if static else 'dynamic'}", max_tokens=args.max_tokens,
                              max_model_len=1024, gen_batch_size=args.batch, static_cache=static)
        t0 = time.perf_counter()
        first = regen(convs[: args.batch])  # first batch: load, padding check, warm-up (compile)
        t1 = time.perf_counter()
        rest = regen(convs[args.batch:])
        t2 = time.perf_counter()
        answers[static] = [c.messages for c in first + rest]
        n = len(convs) - args.batch
        steps = -(-n // args.batch) * args.max_tokens
        new_tokens = sum(len(tok(c.messages[-1]["content"], add_special_tokens=False)["input_ids"])
                         for c in rest if c.messages[-1]["role"] == "assistant")
        print(f"{'static' if static else 'dynamic'} cache: first batch (load + check + warm-up) {t1 - t0:.1f} s; "
              f"then {n} answers, {new_tokens:,} new tokens (re-tokenised) in {t2 - t1:.1f} s = "
              f"{new_tokens / (t2 - t1):,.0f} tok/s, {1000 * (t2 - t1) / steps:.1f} ms per decode step at batch "
              f"{args.batch}; attention {regen._load().config._attn_implementation}", flush=True)
        regen.close()
    if args.static:
        same = sum(a == b for a, b in zip(answers[False], answers[True]))
        print(f"static == dynamic answers: {same} / {len(answers[False])}")

if __name__ == "__main__":
    main()
