"""Training-step throughput: one long packed row per batch against several short rows
(`train.row_tokens`), same samples, same head, timed round-robin in one run.

    python bench/row_packing.py --out rows.json                       # CPU: 4,096-token batches
    python bench/row_packing.py --max-tokens 16384 --rows 2048 1024 --out rows.json   # GPU

TTT attention is dense within a row: one row of T tokens costs O(T^2) per TTT step (and
O(k T^2) at step k, the diagonal blocks), whatever the samples inside it. Samples follow
smollm2_full's lengths (uniform 60..1024 tokens, mean ~540; the real mean is ~320).
The head is SmolLM2-135M-shaped (H=576, 9/3 heads; draft vocab 32000 on GPU, 4096 on CPU
where the lm_head would otherwise hide everything else), random weights.
"""

from __future__ import annotations

import argparse
import time

import torch
from harness import target_config, write_json

from eagle3.draft import DraftConfig, Eagle3DraftHead, eagle3_loss
from eagle3.store.packing import collate_rows, pack_rows

# SmolLM2-135M's shapes from conf/model/smollm2_135m.yaml, and the config.json fields it lacks
SMOLLM2 = {
    **target_config("smollm2_135m"),
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
}


def _batches(lengths, max_tokens, row_tokens, hidden, n_batches, device):
    packed = pack_rows(lengths, max_tokens, row_tokens, seed=0)[:n_batches]
    g = torch.Generator().manual_seed(1)
    out = []
    for b in packed:
        items = [
            {
                "input_ids": torch.randint(0, 49152, (lengths[i],), generator=g),
                "loss_mask": torch.arange(lengths[i]) >= lengths[i] // 3,
                "hidden": torch.randn(lengths[i], 4, hidden, generator=g).to(torch.bfloat16),
            }
            for i in b
        ]
        out.append({k: v.to(device) for k, v in collate_rows(items, max_tokens, row_tokens).items()})
    return out


def _step(head, opt, batch, ttt, device):
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        logits = head(batch["aux_hidden"], batch["input_ids"], batch["position_ids"], batch["segment_ids"], ttt)
        target, covered = head.teacher_logits(batch)
        loss, _ = eagle3_loss(
            logits,
            target,
            loss_mask=batch["loss_mask"],
            segment_ids=batch["segment_ids"],
            step_decay=0.8,
            covered=covered,
        )
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per batch; default 16384 GPU, 4096 CPU")
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="row_tokens to compare with one row")
    ap.add_argument("--ttt", type=int, default=5)
    ap.add_argument("--draft-vocab", type=int, default=None, help="default 32000 GPU, 4096 CPU")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    max_tokens = args.max_tokens or (16384 if gpu else 4096)
    rows = args.rows or ([2048, 1024] if gpu else [1024, 512])
    vocab = args.draft_vocab or (32000 if gpu else 4096)
    torch.manual_seed(0)
    cfg = DraftConfig.from_target_config(SMOLLM2, draft_vocab_size=vocab, num_aux_layers=3)
    head = Eagle3DraftHead(cfg).to(device)
    d2t = torch.zeros(vocab, dtype=torch.int64)
    t2d = torch.zeros(49152, dtype=torch.bool)
    t2d[:vocab] = True
    head.load_target_weights(
        torch.randn(49152, 576),
        torch.ones(576),
        torch.randn(49152, 576) * 0.02,
        d2t,
        t2d,
        init_lm_head_from_target=True,
    )
    head = head.to(device)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(60, min(1024, min(rows)) + 1, (2000,), generator=g).tolist()
    variants = {"one row": None, **{f"rows of {r}": r for r in rows}}
    data = {name: _batches(lengths, max_tokens, r, 576, args.batches, device) for name, r in variants.items()}
    for name in variants:  # warm-up (allocator, kernels)
        _step(head, opt, data[name][0], args.ttt, device)
    seconds = dict.fromkeys(variants, 0.0)
    tokens = dict.fromkeys(variants, 0)
    for _ in range(args.rounds):
        for name in variants:
            for batch in data[name]:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                _step(head, opt, batch, args.ttt, device)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds[name] += time.perf_counter() - t0
                tokens[name] += int((batch["segment_ids"] >= 0).sum())
    base = tokens["one row"] / seconds["one row"]
    results = []
    print(
        f"device {device}, {max_tokens} tokens per batch, TTT {args.ttt}, V={vocab}, "
        f"{args.batches} batches x {args.rounds} rounds",
        flush=True,
    )
    for name in variants:
        tps = tokens[name] / seconds[name]
        results.append(
            {
                "variant": name,
                "row_tokens": variants[name],
                "tokens": tokens[name],
                "seconds": seconds[name],
                "tokens_per_s": tps,
                "vs_one_row": tps / base,
            }
        )
        print(f"{name:>14}: {tps:>10,.0f} tok/s  {tps / base:.2f}x")
    doc = {
        "device": str(torch.cuda.get_device_name() if gpu else "cpu"),
        "max_tokens": max_tokens,
        "ttt": args.ttt,
        "draft_vocab": vocab,
        "results": results,
    }
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
