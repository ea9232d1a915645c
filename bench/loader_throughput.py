"""The training loader at a target's width: how fast train.py's batches come out of a stored
dataset, by number of DataLoader workers, against a plain copy of the same bytes in the same run.

Real eagle3 code throughout: ShardWriter writes the shards, HiddenStateDataset reads them (its
finite check included), packed_loader packs and collates the batches as train.py's data module
does (hidden [B, T, L, H] whole, in page-locked memory on a CUDA machine). The states are random
bf16 values of the preset's width (4 layers: 3 aux ids + the final one); the shards sit in the
page cache after the first pass, as a dataset that fits the machine's memory does in training.

    python bench/loader_throughput.py --preset kimi_k2_5 --workers 0,2      # this CPU
    python bench/loader_throughput.py --preset kimi_k2_5 --workers 0,2,6 --samples 96 --out loader.json  # a GPU machine

Reported per number of workers: tokens/s and GB/s of hidden states over the last pass, and the
ratio to the copy limit: one thread reading the same samples and copying their states from the
shards' memory map into one batch buffer, no worker, no collate.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from harness import ints, target_config, write_json  # beside this file; puts the checkout on sys.path

from eagle3.store import HiddenStateDataset, ShardWriter
from eagle3.store.packing import pack_rows, packed_loader
from eagle3.target_model.records import CapturedSample

LAYERS = 4  # three aux ids and the final state


def write_dataset(directory: Path, hidden: int, samples: int, tokens: int) -> None:
    writer = ShardWriter(
        directory,
        layer_ids=list(range(LAYERS)),
        hidden_size=hidden,
        dtype=torch.bfloat16,
        fingerprint_inputs={"bench": "loader_throughput", "hidden": hidden},
    )
    g = torch.Generator().manual_seed(0)
    try:
        for i in range(samples):
            writer.add(
                f"s{i}",
                CapturedSample(
                    token_ids=torch.randint(0, 1000, (tokens,), generator=g),  # [T]
                    loss_mask=torch.ones(tokens, dtype=torch.bool),  # [T]
                    hidden=torch.randn(tokens, LAYERS, hidden, generator=g).to(torch.bfloat16),  # [T, L, H]
                ),
            )
        writer.finish(torch.zeros(1000, dtype=torch.int64), val_ids=[])
    finally:
        writer.close()


def loader_rate(ds: HiddenStateDataset, batches: list[list[int]], max_tokens: int, workers: int, passes: int) -> float:
    """Tokens/s of the last of ``passes`` passes (the first warms the page cache and the workers)."""
    cuda = torch.cuda.is_available()
    loader = packed_loader(
        ds, list(range(len(ds))), batches, max_tokens=max_tokens, num_workers=workers, pin_memory=cuda, split=False
    )
    rate = 0.0
    for _ in range(passes):
        t0, tokens = time.perf_counter(), 0
        for batch in loader:
            tokens += int(batch["num_tokens"])
        rate = tokens / (time.perf_counter() - t0)
    return rate


def copy_rate(ds: HiddenStateDataset, batches: list[list[int]], max_tokens: int, passes: int) -> float:
    """The limit: one thread reading the batches' samples (the dataset's finite check included) and
    copying their states into one buffer."""
    like = ds[0]["hidden"]
    buf = torch.empty((max_tokens, *like.shape[1:]), dtype=like.dtype)  # [T, L, H]
    rate = 0.0
    for _ in range(passes):
        t0, tokens = time.perf_counter(), 0
        for batch in batches:
            off = 0
            for i in batch:
                h = ds[i]["hidden"]  # [T_i, L, H], the memory map
                n = min(h.shape[0], max_tokens - off)
                buf[off : off + n] = h[:n]
                off += n
            tokens += off
        rate = tokens / (time.perf_counter() - t0)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="kimi_k2_5", help="conf/model preset whose hidden size the states have")
    ap.add_argument("--workers", type=ints, default=[0, 2], help="DataLoader workers to measure, comma-separated")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per sample")
    ap.add_argument("--max-tokens", type=int, default=8192, help="tokens per batch (train.max_tokens_per_batch)")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None, help="where the dataset is written (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    hidden = int(target_config(args.preset)["hidden_size"])
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ds_dir = Path(tmp) / "ds"
        write_dataset(ds_dir, hidden, args.samples, args.tokens)
        ds = HiddenStateDataset(ds_dir)
        batches = pack_rows(ds.lengths, args.max_tokens, None)
        limit = copy_rate(ds, batches, args.max_tokens, args.passes)
        rates = {w: loader_rate(ds, batches, args.max_tokens, w, args.passes) for w in args.workers}
    gb = LAYERS * hidden * 2 / 1e9  # GB of states per token
    print(f"| loader ({args.preset}: hidden {hidden}, {LAYERS} layers) | tok/s | GB/s | / copy limit |")
    print("|---|---|---|---|")
    print(f"| copy limit (one thread, no collate) | {limit:,.0f} | {limit * gb:.2f} | 1.00 |")
    for w, r in rates.items():
        print(f"| num_workers={w} | {r:,.0f} | {r * gb:.2f} | {r / limit:.2f} |")
    result = {
        "preset": args.preset,
        "hidden_size": hidden,
        "layers": LAYERS,
        "samples": args.samples,
        "tokens_per_sample": args.tokens,
        "max_tokens": args.max_tokens,
        "cuda": torch.cuda.is_available(),
        "copy_limit_tok_s": limit,
        "loader_tok_s": {str(w): r for w, r in rates.items()},
        "ratio_to_copy_limit": {str(w): r / limit for w, r in rates.items()},
    }
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
