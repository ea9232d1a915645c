"""The shards' storage formats (capture.storage) on real captured states: bytes per token, the
reconstruction error, what fp8 would do to the teacher's distribution were the final layer
stored in it too, and the cost of the format on both sides: the writer's encode (capture side)
and the training loader's decode.

Real eagle3 code throughout: an exact dataset written by extract.py (SmolLM2's states) is read
by HiddenStateDataset, written again in each format by ShardWriter, and read back by
HiddenStateDataset and packed_loader as train.py's data module does (workers 0: this CPU).

    python extract.py data.max_samples=400                        # an exact SmolLM2 dataset
    python bench/storage_formats.py --dataset data/smollm2_135m-sharegpt-<fingerprint> --out storage.json

Reported: bytes per token of the shards and the ratio to exact; per aux layer the relative
error ||x - x'|| / ||x|| and the largest error of a row as a fraction of the row's amax; the
teacher check: the target's next-token distribution softmax(lm_head(norm(h_N))) from the exact
final state against the same from an fp8 final state (KL, top-1 agreement); encode tokens/s
(ShardWriter, one thread) and loader tokens/s, each format against exact, the best of --rounds
rounds that alternate the formats. With --topk 8,16,32,64: per k, the teacher training builds
from the stored top-k against the full one (bench/topk_teacher.py) and the shards' bytes per token
with the final state replaced by k slots of 6 bytes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from harness import write_json  # beside this file; puts the checkout on sys.path
from loader_throughput import loader_rate
from topk_teacher import dataset_vocab, topk_bytes, topk_check

from eagle3.store import HiddenStateDataset, ShardWriter
from eagle3.store.packing import pack_rows
from eagle3.store.storage_format import StorageFormat
from eagle3.target_model.records import CapturedSample

FORMATS = ("exact", "fp8", "int4")


def rewrite(src: HiddenStateDataset, directory: Path, storage: str, limit: int) -> tuple[float, HiddenStateDataset]:
    """``src``'s first ``limit`` samples written in ``storage``; (tokens/s of the writer, the dataset)."""
    writer = ShardWriter(
        directory,
        layer_ids=src.layer_ids,
        hidden_size=src.hidden_size,
        dtype=src.dtype,
        fingerprint_inputs={"bench": "storage_formats", "source": src.fingerprint, "storage": storage},
        storage=StorageFormat(storage),
    )
    samples = [src[i] for i in range(limit)]
    t0, tokens = time.perf_counter(), 0
    for i, s in enumerate(samples):
        writer.add(f"s{i}", CapturedSample(s["input_ids"].clone(), s["loss_mask"].clone(), s["hidden"].clone()))
        tokens += int(s["input_ids"].shape[0])
    writer.finish(torch.zeros(1, dtype=torch.int64), val_ids=[])
    return tokens / (time.perf_counter() - t0), HiddenStateDataset(directory)


def errors(src: HiddenStateDataset, limit: int, storage: str) -> dict[str, list[float]]:
    """Per aux layer: relative Frobenius error and the worst row's max error / amax, ``storage``
    against exact."""
    num, den, worst = None, None, None
    for i in range(limit):
        h = src[i]["hidden"]  # [T, L, H]
        fmt = StorageFormat(storage)
        back = fmt.decode(fmt.encode(h), h.dtype)
        d = back[:, :-1].float() - h[:, :-1].float()  # [T, L-1, H]
        x = h[:, :-1].float()
        n, q = d.pow(2).sum((0, 2)), x.pow(2).sum((0, 2))
        w = (d.abs().amax(-1) / x.abs().amax(-1).clamp_min(1e-30)).amax(0)
        num, den = (n, q) if num is None else (num + n, den + q)
        worst = w if worst is None else torch.maximum(worst, w)
    assert num is not None and den is not None and worst is not None
    return {"rel_error": (num / den).sqrt().tolist(), "worst_row_error_of_amax": worst.tolist()}


def teacher_check(src: HiddenStateDataset, target_dir: str, limit: int) -> dict[str, float]:
    """The target's distribution from the exact final state against an fp8 one (what storing the
    final layer in fp8 would do to the labels)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    norm, head = model.model.norm, model.lm_head
    kl_sum, agree, tokens = 0.0, 0, 0
    with torch.no_grad():
        for i in range(limit):
            h = src[i]["hidden"][:, -1:]  # [T, 1, H]: the final state
            as_aux = torch.cat([h, h], dim=1)  # the codec stores all but the last layer: encode it as an aux one
            fp8 = StorageFormat("fp8")
            q = fp8.decode(fp8.encode(as_aux), h.dtype)[:, :1]
            lp = torch.log_softmax(head(norm(h[:, 0].float())), -1)
            lq = torch.log_softmax(head(norm(q[:, 0].float())), -1)
            kl_sum += float((lp.exp() * (lp - lq)).sum())
            agree += int((lp.argmax(-1) == lq.argmax(-1)).sum())
            tokens += int(h.shape[0])
    return {"kl_per_token": kl_sum / tokens, "top1_agreement": agree / tokens, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True, help="an exact dataset written by extract.py")
    ap.add_argument("--samples", type=int, default=200, help="samples of it to use")
    ap.add_argument("--model-dir", default=None, help="the target (its norm + lm_head) for the teacher check")
    ap.add_argument("--max-tokens", type=int, default=1024, help="tokens per batch (train.max_tokens_per_batch)")
    ap.add_argument("--passes", type=int, default=2, help="loader passes a round (the last is timed)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the formats; the best of each is kept")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--topk", default=None, help="k values, e.g. 8,16,32,64: the top-k teacher against the full one")
    ap.add_argument("--draft-vocab", type=int, default=None, help="for --topk; default: the dataset's vocab file")
    ap.add_argument("--skip-formats", action="store_true", help="only the checks, no timed rounds over the formats")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: as in a DataLoader worker)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    src = HiddenStateDataset(args.dataset)
    if not src.storage.is_exact:
        raise SystemExit(f"{args.dataset}: storage {src.storage}: expected an exact dataset")
    n = min(args.samples, len(src))
    result: dict = {"dataset": str(args.dataset), "samples": n, "layer_ids": list(src.layer_ids)}
    result["errors"] = {storage: errors(src, n, storage) for storage in FORMATS[1:]}
    if args.target_dir:
        result["teacher_if_final_fp8"] = teacher_check(src, args.target_dir, n)
    ks = [int(k) for k in args.topk.split(",")] if args.topk else []
    if ks:
        if not args.target_dir:
            raise SystemExit("--topk needs --model-dir (the target's norm and lm_head)")
        vocab = args.draft_vocab or dataset_vocab(args.dataset)
        result["topk"] = {"draft_vocab": vocab, "per_k": topk_check(src, args.target_dir, n, ks, vocab)}
    if args.skip_formats:
        print_topk(result, ks, None, src)
        if args.out:
            write_json(args.out, result)
        return
    # rounds alternate the formats and each figure is the best round's: on a shared machine a
    # neighbour's burst slows one round, never speeds one up
    per: dict[str, dict[str, float]] = {s: {"write_tok_s": 0.0, "loader_tok_s": 0.0} for s in FORMATS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for storage in FORMATS:
                write_rate, ds = rewrite(src, Path(tmp) / f"{storage}-{r}", storage, n)
                batches = pack_rows(ds.lengths, args.max_tokens, None)
                row = per[storage]
                row["bytes_per_token"] = sum(s.size_bytes for s in ds.manifest.shards) / ds.num_tokens
                row["write_tok_s"] = max(row["write_tok_s"], write_rate)
                row["loader_tok_s"] = max(
                    row["loader_tok_s"], loader_rate(ds, batches, args.max_tokens, 0, args.passes)
                )
    for storage in FORMATS:
        for key in ("bytes_per_token", "write_tok_s", "loader_tok_s"):
            per[storage][f"{key}_vs_exact"] = per[storage][key] / per["exact"][key]
    result["formats"] = per
    print("| format | bytes/token | vs exact | write tok/s | vs exact | loader tok/s | vs exact |")
    print("|---|---|---|---|---|---|---|")
    for storage, r in per.items():
        print(
            f"| {storage} | {r['bytes_per_token']:,.0f} | {r['bytes_per_token_vs_exact']:.3f} | {r['write_tok_s']:,.0f} | "
            f"{r['write_tok_s_vs_exact']:.2f} | {r['loader_tok_s']:,.0f} | {r['loader_tok_s_vs_exact']:.2f} |"
        )
    for storage, e in result["errors"].items():
        print(
            f"{storage} aux layers: relative error {[round(x, 4) for x in e['rel_error']]}, "
            f"worst row {[round(x, 4) for x in e['worst_row_error_of_amax']]} of its amax"
        )
    if "teacher_if_final_fp8" in result:
        t = result["teacher_if_final_fp8"]
        print(
            f"final layer in fp8 (not stored so): KL {t['kl_per_token']:.2e} nats/token, "
            f"top-1 agreement {t['top1_agreement']:.4f} over {t['tokens']} tokens"
        )
    print_topk(result, ks, per, src)
    if args.out:
        write_json(args.out, result)


def print_topk(result: dict, ks: list[int], per: dict[str, dict[str, float]] | None, src: HiddenStateDataset) -> None:
    """The top-k table (and its bytes per token beside each aux format, when the formats ran)."""
    if not ks:
        return
    final_bytes = src.hidden_size * torch.tensor([], dtype=src.dtype).element_size()  # the exact final state
    print(f"top-k teacher against the full one on the draft vocab ({result['topk']['draft_vocab']} tokens):")
    print(
        "| k | KL(topk||full) nats/token | TV | top-1 agreement | mass held | draft-vocab mass held | no draft token | bytes/token |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for k in ks:
        r = result["topk"]["per_k"][str(k)]
        sizes = topk_bytes(per, final_bytes, k) if per else {}
        r["bytes_per_token"] = sizes
        shown = (
            ", ".join(f"{s} {b:,.0f} ({b / per['exact']['bytes_per_token']:.3f}x)" for s, b in sizes.items())
            if per
            else "-"
        )
        print(
            f"| {k} | {r['kl_per_token']:.3f} | {r['tv_per_token']:.3f} | {r['top1_agreement']:.4f} | {r['mass']:.4f} | {r['draft_mass']:.4f} | "
            f"{r['uncovered']:.4f} | {shown} |"
        )


if __name__ == "__main__":
    main()
