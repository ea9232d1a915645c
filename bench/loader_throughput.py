"""The training loader at a target's width: how fast train.py's batches come out of a stored
dataset, by number of DataLoader workers, against a plain copy of the same bytes in the same run;
and each storage format (capture.storage) against exact in the same run, by where it is decoded.

Real eagle3 code throughout: ShardWriter writes the shards, HiddenStateDataset reads them (its
finite check included), packed_loader packs and collates the batches as train.py's data module
does (hidden [B, T, L, H] whole, in page-locked memory on a CUDA machine), and each batch goes
to the training device and is split (exact) or decoded there as the data module's
on_after_batch_transfer does. The states are random bf16 values of the preset's width (4 layers:
3 aux ids + the final one); the shards sit in the page cache after the first pass, as a dataset
that fits the machine's memory does in training.

Routes of a format other than exact: ``loader``, the workers decode each sample (what train.py
does on a CPU); ``device``, the loader hands the format's tensors and the batch is decoded after
the copy to the device (what train.py does on a GPU; on a CPU the "device" is the training
process itself, so its decode is counted there).

    python bench/loader_throughput.py --preset kimi_k2_5 --workers 0,2      # this CPU
    python bench/loader_throughput.py --preset kimi_k2_5 --workers 0,2,6 --samples 96 --out loader.json  # a GPU machine
    python bench/loader_throughput.py --preset llama3_1_8b --workers 6 --storages exact,fp8 --samples 96  # fp8 on a GPU

Reported per format, route and number of workers: tokens/s and GB/s of exact states over the last
pass, the ratio to exact with the same workers (the issue's goal for fp8 on a GPU: >= 1), and for
exact the ratio to the copy limit: one thread reading the same samples and copying their states
from the shards' memory map into one batch buffer, no worker, no collate.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
from harness import ints, target_config, write_json  # beside this file; puts the checkout on sys.path

from eagle3.store import HiddenStateDataset, ShardWriter
from eagle3.store.batch_options import BatchShape
from eagle3.store.packing import decode_hidden, pack_rows, packed_loader
from eagle3.store.storage_format import EXACT, STORAGES, StorageFormat
from eagle3.store.write_options import WriteOptions
from eagle3.target_model.records import CapturedSample

LAYERS = 4  # three aux ids and the final state


ROUTES = ("loader", "device")  # where a format other than exact is decoded


def write_dataset(directory: Path, hidden: int, samples: int, tokens: int, storage: str = EXACT) -> None:
    """``samples`` random samples (the same values for every ``storage``) in that format."""
    writer = ShardWriter(
        directory,
        layer_ids=list(range(LAYERS)),
        hidden_size=hidden,
        dtype=torch.bfloat16,
        fingerprint_inputs={"bench": "loader_throughput", "hidden": hidden},
        storage=StorageFormat(storage),
        write=WriteOptions(background=True, writer_threads=2),
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


def loader_rate(
    ds: HiddenStateDataset,
    batches: list[list[int]],
    max_tokens: int,
    workers: int,
    passes: int,
    *,
    route: str = "loader",
    to_device: bool = False,
) -> float:
    """Tokens/s of the last of ``passes`` passes (the first warms the page cache and the workers).
    ``route="device"``: the loader hands the format's tensors, decoded after the transfer.
    ``to_device``: each batch also goes to the training device (CUDA when there is one) and is
    split or decoded there, as train.py's data module does; the pass ends when the device is done."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    samples = ds.encoded_rows() if route == "device" else ds
    loader = packed_loader(
        samples,
        list(range(len(ds))),
        batches,
        shape=BatchShape(max_tokens),
        num_workers=workers,
        pin_memory=cuda,
        split=False,
    )
    rate = 0.0
    for _ in range(passes):
        t0, tokens = time.perf_counter(), 0
        for batch in loader:
            tokens += int(batch["num_tokens"])
            if to_device:
                moved = {k: v.to(device, non_blocking=True) if k != "num_tokens" else v for k, v in batch.items()}
                decode_hidden(moved, ds.storage, ds.dtype)  # exact: the aux/final split
        if cuda:
            torch.cuda.synchronize()
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


def format_rates(
    directory: Path, hidden: int, args: argparse.Namespace
) -> tuple[float, dict[tuple[str, str, int], float]]:
    """(the copy limit of the exact dataset, tokens/s per (storage, route, workers)), the formats
    measured one after another on the same samples; the exact dataset's route is ``loader``."""
    rates: dict[tuple[str, str, int], float] = {}
    limit = 0.0
    for storage in args.storages:
        dataset_dir = directory / storage
        write_dataset(dataset_dir, hidden, args.samples, args.tokens, storage)
        ds = HiddenStateDataset(dataset_dir)
        batches = pack_rows(ds.lengths, args.max_tokens, None)
        if storage == EXACT:
            limit = copy_rate(ds, batches, args.max_tokens, args.passes)
        for route in ("loader",) if storage == EXACT else args.routes:
            for w in args.workers:
                rate = loader_rate(ds, batches, args.max_tokens, w, args.passes, route=route, to_device=True)
                rates[(storage, route, w)] = rate
        shutil.rmtree(dataset_dir)  # one format's shards on disk at a time
    return limit, rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="kimi_k2_5", help="conf/model preset whose hidden size the states have")
    ap.add_argument("--workers", type=ints, default=[0, 2], help="DataLoader workers to measure, comma-separated")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per sample")
    ap.add_argument("--max-tokens", type=int, default=8192, help="tokens per batch (train.max_tokens_per_batch)")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument(
        "--storages",
        type=lambda s: [x for x in s.split(",") if x],
        default=[EXACT],
        help=f"capture.storage formats to measure, comma-separated, of {list(STORAGES)} (exact always first)",
    )
    ap.add_argument(
        "--routes",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(ROUTES),
        help="where a format other than exact is decoded: loader (the workers), device (after the transfer)",
    )
    ap.add_argument("--dir", type=Path, default=None, help="where the datasets are written (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    bad = [s for s in args.storages if s not in STORAGES] + [r for r in args.routes if r not in ROUTES]
    if bad:
        ap.error(f"--storages / --routes: expected {list(STORAGES)} / {list(ROUTES)}, got {bad}")
    args.storages = [EXACT, *(s for s in dict.fromkeys(args.storages) if s != EXACT)]

    hidden = int(target_config(args.preset)["hidden_size"])
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        limit, rates = format_rates(Path(tmp), hidden, args)
    gb = LAYERS * hidden * 2 / 1e9  # GB of exact states per token
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "this CPU"
    print(
        f"| loader ({args.preset}: hidden {hidden}, {LAYERS} layers; batches to {device}) | tok/s | GB/s | / exact | / copy limit |"
    )
    print("|---|---|---|---|---|")
    print(f"| copy limit (one thread, no collate) | {limit:,.0f} | {limit * gb:.2f} | | 1.00 |")
    for (storage, route, w), r in rates.items():
        what = "exact" if storage == EXACT else f"{storage}, decoded in the {route}"
        vs_exact = r / rates[(EXACT, "loader", w)]
        print(f"| {what}, num_workers={w} | {r:,.0f} | {r * gb:.2f} | {vs_exact:.2f} | {r / limit:.2f} |")
    result = {
        "preset": args.preset,
        "hidden_size": hidden,
        "layers": LAYERS,
        "samples": args.samples,
        "tokens_per_sample": args.tokens,
        "max_tokens": args.max_tokens,
        "cuda": torch.cuda.is_available(),
        "device": device,
        "copy_limit_tok_s": limit,
        "loader_tok_s": {str(w): r for (s, _, w), r in rates.items() if s == EXACT},
        "ratio_to_copy_limit": {str(w): r / limit for (s, _, w), r in rates.items() if s == EXACT},
        "formats": [
            {
                "storage": s,
                "route": route,
                "workers": w,
                "tok_s": r,
                "ratio_to_exact": r / rates[(EXACT, "loader", w)],
            }
            for (s, route, w), r in rates.items()
        ],
    }
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
