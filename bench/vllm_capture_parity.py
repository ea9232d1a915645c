"""capture=vllm against capture=hf on the same samples: token ids equal and the per-layer
cosine of every token's hidden state, on real chat data (the samples extract.py would capture)
and on chats that share a prefix; plus what vLLM's final-layer id N holds (the pre-norm final
state that the HF backend captures, or the normed one transformers returns last).

    python bench/vllm_capture_parity.py --model-dir DIR --chat sharegpt.jsonl --n 200 \
        --out parity.json [--keep-files DIR --keep-n 3]

--keep-files: the files vLLM's connector wrote for the --keep-n shortest samples cut to
--keep-max-tokens tokens, with a sidecar JSON each (sample id, loss mask). Runs where vLLM
does (CUDA: the stock connector, route native; the CPU build: the host-copy connector); the HF
side runs on the same device.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from harness import write_json  # beside this file; puts the checkout on sys.path

from eagle3.data.pipeline import ChatSource, prepare_samples
from eagle3.target_model.capture_hf import HFCaptureBackend
from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend

CAPTURE_IDS = (2, 15, 27, 30)  # SmolLM2: aux [2, 15, 27] + N = 30


def shared_prefix_samples(samples, count: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Each of ``count`` long samples cut at a half and at three quarters of its length: three
    prompts sharing a prefix, captured in one batch."""
    out = []
    longest = sorted(samples, key=lambda s: -int(s.input_ids.numel()))[:count]
    for s in longest:
        T = int(s.input_ids.numel())
        for cut in (T // 2, (3 * T) // 4, T):
            out.append((f"{s.id}:prefix{cut}", s.input_ids[:cut].clone(), s.loss_mask[:cut].clone()))
    return out


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per token and layer: cos(a[t, l], b[t, l]) for [T, L, H] -> [T, L]."""
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def final_norm_check(target_dir: str, feed, vllm_records: dict, device: str, n: int = 8) -> dict:
    """vLLM's id N against transformers' last hidden state (after the final norm) and against
    the state before it (the last decoder layer's output, hooked)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).to(device).eval()
    pre: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda mod, args, out: pre.append(args[0][0]))
    post_cos, pre_cos = [], []
    with torch.no_grad():
        for sample_id, ids, _ in feed[:n]:
            pre.clear()
            out = model(ids[None].to(device), output_hidden_states=True)
            v = vllm_records[sample_id].hidden[:, -1].to(device)
            post_cos.append(torch.nn.functional.cosine_similarity(v.float(), out.hidden_states[-1][0].float(), dim=-1))
            pre_cos.append(torch.nn.functional.cosine_similarity(v.float(), pre[0].float(), dim=-1))
    hook.remove()
    return {
        "samples": min(n, len(feed)),
        "cos_vs_pre_norm_final_state": float(torch.cat(pre_cos).mean()),
        "cos_vs_transformers_last_hidden_state_after_norm": float(torch.cat(post_cos).mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--chat", required=True, help="JSONL chat file (data=jsonl's format)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--shared-prefix", type=int, default=20, help="long samples cut into 3 prompts sharing a prefix")
    ap.add_argument("--out", required=True)
    ap.add_argument("--keep-files", default=None)
    ap.add_argument("--keep-n", type=int, default=3)
    ap.add_argument("--keep-max-tokens", type=int, default=40)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.target_dir)
    data = prepare_samples(
        ChatSource("jsonl", args.chat),
        tok,
        max_samples=args.n,
        max_length=args.max_length,
        overflow="truncate",
        val_fraction=0.0,
        seed=0,
        progress=False,
    )
    samples = data.train + data.val
    feed = [(s.id, s.input_ids, s.loss_mask) for s in samples]
    feed += shared_prefix_samples(samples, args.shared_prefix)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    keep_ids: set[str] = set()
    feed_keep: list = []
    if args.keep_files:
        Path(args.keep_files).mkdir(parents=True, exist_ok=True)
        # the shortest samples, each cut to --keep-max-tokens (a few hundred KB in all)
        short = sorted(feed, key=lambda f: f[1].numel())[: args.keep_n]
        keep = [
            (f"{sid}:first{args.keep_max_tokens}", ids[: args.keep_max_tokens], m[: args.keep_max_tokens])
            for sid, ids, m in short
        ]
        keep_ids = {f[0] for f in keep}
        feed_keep = keep
    t0 = time.perf_counter()
    engine = CaptureEngine(max_model_len=args.max_length + 8, max_num_seqs=64, gpu_memory_utilization=0.5)
    with VLLMCaptureBackend(args.target_dir, CAPTURE_IDS, engine=engine, keep_files_dir=None) as vb:
        route = vb.route
        if keep_ids:  # the kept files come from a call of their own (only those are moved)
            vb.keep_files_dir = args.keep_files
            kept = dict(vb.capture_with_ids(feed_keep))
            vb.keep_files_dir = None
            for sid, rec in kept.items():
                side = {"sample_id": sid, "loss_mask": rec.loss_mask.int().tolist(), "layer_ids": list(CAPTURE_IDS)}
                (Path(args.keep_files) / f"{sid}.json").write_text(json.dumps(side))
        v = dict(vb.capture_with_ids(feed))
        vllm_stats = {"tokens": vb.stats.tokens, "seconds": vb.stats.seconds, "read_seconds": vb.stats.read_seconds}
    vllm_s = time.perf_counter() - t0
    with HFCaptureBackend(args.target_dir, CAPTURE_IDS, device=device) as hb:
        h = dict(hb.capture_with_ids(feed))

    groups = {
        "chat": [f[0] for f in feed if ":prefix" not in f[0]],
        "shared_prefix": [f[0] for f in feed if ":prefix" in f[0]],
    }
    report: dict = {
        "route": route,
        "device": device,
        "layer_ids": list(CAPTURE_IDS),
        "vllm": vllm_stats,
        "vllm_wall_s": vllm_s,
    }
    for name, ids in groups.items():
        ids_equal = all(torch.equal(v[i].token_ids, h[i].token_ids) for i in ids)
        cos = torch.cat([cosines(v[i].hidden, h[i].hidden) for i in ids])  # [sum T, L]
        report[name] = {
            "samples": len(ids),
            "tokens": int(cos.shape[0]),
            "token_ids_equal": ids_equal,
            "full_length": all(v[i].hidden.shape[0] == v[i].token_ids.shape[0] for i in ids),
            "mean_cosine_per_layer": {str(k): float(cos[:, j].mean()) for j, k in enumerate(CAPTURE_IDS)},
            "min_cosine_per_layer": {str(k): float(cos[:, j].min()) for j, k in enumerate(CAPTURE_IDS)},
        }
    report["final_layer_id"] = final_norm_check(args.target_dir, feed, v, device)
    write_json(args.out, report, echo=True)


if __name__ == "__main__":
    main()
