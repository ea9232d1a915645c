"""The shard writer at a target's width: states as vLLM's capture hands them over (bf16 on the
host) written into shards by ShardWriter in each storage format, encoded where a GPU topology's
writer threads encode them (``encode_device``, a chunk of samples at a time), each format against
exact in the same run. What it answers: whether the writer keeps up with the capture at that width
(vLLM's capture rates: docs/records/2026-12-02-vllm-capture-eval-serving.md, 2026-12-04-rehearsal-llama3-8b.md and 2026-12-05-storage-formats.md). At SmolLM2's width vLLM's capture
with fp8 + the top-32 ran at 0.77x of exact's rate on an H100; this bench separates the writer's
part of that from the reading of vLLM's files, and measures it at 8B-and-up widths without vLLM.

Real eagle3 code: ShardWriter with its writer threads (encode, hash, write to disk), the teacher's
projection (TeacherProjection, random weights of the preset's vocabulary on the encode device).
The states are random bf16 values, the same for every format, 4 layers (3 aux ids + the final).

    python bench/writer_throughput.py --preset smollm2_135m --device none --samples 40      # this CPU
    python bench/writer_throughput.py --preset llama3_1_8b --device cuda --samples 400 --out writer.json

Reported per format: tokens/s and GB/s of the captured states (the best of --rounds rounds that
alternate the formats), the ratio to exact, and bytes per token on disk.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
from harness import add_out, target_config, write_json  # beside this file; puts the checkout on sys.path

from eagle3.store import ShardWriter
from eagle3.store.storage_format import StorageFormat
from eagle3.store.teacher_topk import TeacherProjection
from eagle3.store.write_options import WriteOptions
from eagle3.target_model.records import CapturedSample

LAYERS = 4  # three aux ids and the final state


def samples(n: int, tokens: int, hidden: int) -> list[CapturedSample]:
    g = torch.Generator().manual_seed(0)
    return [
        CapturedSample(
            token_ids=torch.randint(0, 1000, (tokens,), generator=g),  # [T]
            loss_mask=torch.ones(tokens, dtype=torch.bool),  # [T]
            hidden=torch.randn(tokens, LAYERS, hidden, generator=g).to(torch.bfloat16),  # [T, L, H]
        )
        for _ in range(n)
    ]


def projection(hidden: int, vocab: int, k: int, device: str) -> TeacherProjection:
    g = torch.Generator().manual_seed(1)
    norm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)  # [H]
    lm_head = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(torch.bfloat16)  # [V, H]
    return TeacherProjection(norm.to(device), 1e-5, lm_head.to(device), k)


def write_rate(
    directory: Path,
    data: list[CapturedSample],
    storage: StorageFormat,
    teacher: TeacherProjection | None,
    device: str | None,
    threads: int,
) -> tuple[float, int]:
    """(seconds from the first add to a finished dataset, bytes on disk)."""
    writer = ShardWriter(
        directory,
        layer_ids=list(range(LAYERS)),
        hidden_size=int(data[0].hidden.shape[-1]),
        dtype=torch.bfloat16,
        fingerprint_inputs={"bench": "writer_throughput"},
        storage=storage,
        write=WriteOptions(background=True, writer_threads=threads, encode_device=device),
    )
    if teacher is not None:
        writer.set_teacher(teacher)
    try:
        start = time.perf_counter()
        for i, s in enumerate(data):
            writer.add(f"s{i}", s)
        writer.finish(torch.zeros(1000, dtype=torch.int64), val_ids=[])
        seconds = time.perf_counter() - start
    finally:
        writer.close()
    return seconds, sum(f.stat().st_size for f in directory.glob("shard-*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="smollm2_135m", help="conf/model preset whose width and vocabulary to use")
    ap.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "none", help="cuda | cpu | none (host)"
    )
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=850, help="tokens a sample (ShareGPT's two turns: ~850)")
    ap.add_argument("--formats", default="exact,fp8,fp8+32", help="exact | fp8 | int4, +K for the teacher's top-K")
    ap.add_argument("--writer-threads", type=int, default=2, help="capture.writer_threads")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work-dir", default=None, help="where the shards go (default: a temp dir)")
    add_out(ap, required=False)
    args = ap.parse_args()
    config = target_config(args.preset)
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    device = None if args.device == "none" else args.device
    data = samples(args.samples, args.tokens, hidden)
    tokens = args.samples * args.tokens
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="writer_throughput-"))
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.rounds):
        for name in formats:
            kind, _, k_text = name.partition("+")
            k = int(k_text.removeprefix("top")) if k_text else None
            storage = StorageFormat(kind, k)
            teacher = projection(hidden, vocab, k, device or "cpu") if k else None
            directory = work / name
            shutil.rmtree(directory, ignore_errors=True)
            seconds, size = write_rate(directory, data, storage, teacher, device, args.writer_threads)
            shutil.rmtree(directory, ignore_errors=True)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, size)
    state_bytes = tokens * LAYERS * hidden * 2
    exact = best.get("exact")
    rows = []
    print(
        f"| format ({args.preset}, width {hidden}, encode on {args.device}) | tok/s | GB/s of states | / exact | bytes/token |"
    )
    print("|---|---|---|---|---|")
    for name, (seconds, size) in best.items():
        ratio = exact[0] / seconds if exact else None
        rows.append(
            {
                "format": name,
                "tok_s": tokens / seconds,
                "gb_s": state_bytes / seconds / 1e9,
                "vs_exact": ratio,
                "bytes_per_token": size / tokens,
            }
        )
        r = rows[-1]
        shown = f"{ratio:.2f}" if ratio is not None else "-"
        print(f"| {name} | {r['tok_s']:,.0f} | {r['gb_s']:.2f} | {shown} | {r['bytes_per_token']:,.0f} |")
    write_json(
        args.out,
        {
            "preset": args.preset,
            "device": args.device,
            "samples": args.samples,
            "tokens": tokens,
            "writer_threads": args.writer_threads,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
