"""Hidden-state extraction throughput: eagle3's HF capture backend writing shards, against
a plain transformers forward (the peer) and the compute limit of the machine.

    python bench/extract_throughput.py --out extract.json                    # CPU: SmolLM2-135M
    python bench/extract_throughput.py --backends hf vllm --out extract.json  # + vLLM (CPU)
    python bench/extract_throughput.py --model llama3-8b-random --out extract.json  # GPU

Runs (each over the same --batches x --batch-size x --seq random-token prompts, capturing
4 layers: the default aux ids [2, N//2, N-3] and N):

    plain        model(..., output_hidden_states=True), keep the 4 layers on the device
    plain_d2h    the same, then copy the 4 layers to host memory
    hf_nowrite   extract.py's capture loop into DropRecords (forward + hooks + copy + adapter), no disk
    hf           extract.py's capture loop (eagle3/extraction/capture_loop.py: capture_into):
                 HFCaptureBackend.capture_with_ids -> ShardWriter(background=True) on local disk:
                 shards written on the writer thread, sha256 taken while writing;
                 reopened with verify="full" afterwards (untimed) to prove every digest
    hf_overlap   hf with HFCaptureBackend.overlap_host_copy: batch i finished (host copy waited
                 for) only after forward i+1 is queued, so the copy runs beside it (CUDA; off by
                 default until this run shows it faster)
    hf_breakdown hf instrumented (timers around forward with a device sync, launch, finish,
                 shard writes): where the time goes; the sync removes the copy overlap
    hf_1thread   the same with one writer thread (the previous default)
    hf_sync      the same with ShardWriter(background=False): each full shard is written in
                 the capture loop (no overlap)
    disk         the disk alone: the same bytes in shard-sized files, written + fsynced by
                 --writer-threads threads, no hashing: the tokens/s this disk allows
    vllm         VLLMCaptureBackend -> ShardWriter (CPU; only if eagle3/target_model/capture_vllm.py
                 exists and vLLM imports; engine start-up is reported, not timed)

Compute limit = measured bf16 matmul peak / (2 x parameters): tokens/s if every parameter
did one multiply-add per token at the machine's peak. `--model llama3-8b-random` builds a
Llama-3.1-8B-shaped model with random bf16 weights directly on the device (no download),
and hands it to HFCaptureBackend in place of a checkpoint (labelled in the results).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

LLAMA_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
LLAMA_8B_PARAMS = 8.03e9  # the full Llama-3.1-8B (with lm_head): the brief's "2 x params" limit


@dataclass
class RunResult:
    run: str
    status: str = "ok"
    tokens: int = 0
    seconds: float = 0.0
    tokens_per_s: float = 0.0
    fraction_of_limit: float = 0.0
    breakdown_s: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_tflops(device: torch.device, dtype=torch.bfloat16) -> dict[str, float]:
    """Best of a few large matmuls (the Llama-8B MLP shape and a square one), in TFLOP/s."""
    gpu = device.type == "cuda"
    shapes = [(16384, 4096, 14336), (8192, 8192, 8192)] if gpu else [(2048, 2048, 2048)]
    out = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        best = float("inf")
        for _ in range(5):  # best of 5 timings (the CPU here is shared with other jobs)
            reps = 10 if gpu else 2
            sync(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            sync(device)
            best = min(best, (time.perf_counter() - t0) / reps)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e12
        del a, b
    return out


# ----------------------------------------------------------------------------- models and data


def build_model(args, device: torch.device):
    """(base model, its vLLM-style layer count, parameter count for the limit, target_dir or None)."""
    from transformers import AutoModel, LlamaConfig

    if args.model == "llama3-8b-random":
        cfg = LlamaConfig(**LLAMA_8B)
        cfg._attn_implementation = "sdpa"
        with torch.device(device):
            model = AutoModel.from_config(cfg, dtype=torch.bfloat16)
        return model.eval(), cfg.num_hidden_layers, LLAMA_8B_PARAMS, None
    from eagle3.target_model.resolve import materialize_smollm2

    target_dir = str(materialize_smollm2(args.cache_dir))
    model = AutoModel.from_pretrained(target_dir, dtype=torch.bfloat16).to(device).eval()
    params = sum(p.numel() for p in model.parameters())  # tied embeddings: the lm_head is these rows
    return model, model.config.num_hidden_layers, float(params), target_dir


def make_prompts(args, vocab: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    n = args.batches * args.batch_size
    return [
        (f"s{i:05d}", torch.randint(0, vocab, (args.seq,), generator=g), torch.rand(args.seq, generator=g) < 0.7)
        for i in range(n)
    ]


# ----------------------------------------------------------------------------- instrumentation


class Timers:
    """Accumulated seconds per name; `wrap` patches module.attr with a timed version."""

    def __init__(self, device: torch.device):
        self.seconds: dict[str, float] = {}
        self.device = device
        self._stack = contextlib.ExitStack()

    def wrap(self, owner, attr: str, name: str, sync_device: bool = False) -> None:
        original = getattr(owner, attr)
        own_attr = attr in vars(owner)  # a module instance's forward is a class attribute

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                if sync_device:
                    sync(self.device)
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, timed)
        if own_attr:
            self._stack.callback(setattr, owner, attr, original)
        else:
            self._stack.callback(delattr, owner, attr)

    def close(self) -> None:
        self._stack.close()


# ----------------------------------------------------------------------------- runs


@torch.inference_mode()
def run_plain(model, prompts, keep: list[int], args, device, to_host: bool) -> RunResult:
    res = RunResult("plain_d2h" if to_host else "plain")
    batches = [
        torch.stack([p[1] for p in prompts[i : i + args.batch_size]]) for i in range(0, len(prompts), args.batch_size)
    ]
    warm = batches[0].to(device)  # warm-up: the same call as timed
    model(input_ids=warm, attention_mask=torch.ones_like(warm), output_hidden_states=True, use_cache=False)
    sync(device)
    t0 = time.perf_counter()
    for ids in batches:
        ids = ids.to(device)
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True, use_cache=False)
        kept = [out.hidden_states[i] for i in keep]
        if to_host:
            kept = [h.cpu() for h in kept]
        del out, kept
    sync(device)
    res.seconds = time.perf_counter() - t0
    res.tokens = sum(int(b.numel()) for b in batches)
    return res


def hf_backend(model, target_dir, layer_ids, device, args):
    """HFCaptureBackend; for a random model, the in-memory model is handed to it (its ``model=``)
    instead of a checkpoint to read (capture, hooks and checks are the backend's own)."""
    from eagle3.target_model.capture_hf import HFCaptureBackend

    return HFCaptureBackend(
        target_dir or "<random llama3-8b in memory>",
        layer_ids,
        dtype=torch.bfloat16,
        device=str(device),
        max_tokens_per_batch=args.batch_size * args.seq,
        batch_size=args.batch_size,
        model=model if target_dir is None else None,
    )


def open_writer(root: str, layer_ids, hidden: int, name: str, background: bool, args):
    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    threads = 1 if name == "hf_1thread" else args.writer_threads
    return open_writer_existing(
        root, layer_ids, hidden, name, args, verify="fast", background=background, writer_threads=threads
    )


def open_writer_existing(
    root: str,
    layer_ids,
    hidden: int,
    name: str,
    args,
    verify: str = "full",
    background: bool = False,
    writer_threads: int = 1,
):
    from eagle3.store import ShardWriter
    from eagle3.store.write_options import ExistingShards, WriteOptions

    directory = os.path.join(root, name)
    return ShardWriter(
        directory,
        layer_ids=layer_ids,
        hidden_size=hidden,
        dtype=torch.bfloat16,
        fingerprint_inputs={"bench": "extract_throughput", "run": name},
        write=WriteOptions(args.shard_tokens, background=background, writer_threads=writer_threads),
        existing=ExistingShards(verify),
    )


def run_disk(args, root: str, bytes_per_token: int) -> RunResult:
    """Write + fsync the bytes a capture of these prompts produces, in shard-sized files from
    --writer-threads threads, without hashing or serialising: the disk's own ceiling."""
    from concurrent.futures import ThreadPoolExecutor

    res = RunResult("disk")
    tokens = args.batches * args.batch_size * args.seq
    shard = args.shard_tokens * bytes_per_token
    total = tokens * bytes_per_token
    block = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8).numpy().tobytes()  # 64 MiB, reused
    directory = os.path.join(root, "disk")
    os.makedirs(directory, exist_ok=True)

    def one(k: int, size: int) -> None:
        with open(os.path.join(directory, f"f{k}"), "wb") as f:
            left = size
            while left > 0:
                left -= f.write(memoryview(block)[: min(left, len(block))])
            f.flush()
            os.fsync(f.fileno())

    sizes = [min(shard, total - o) for o in range(0, total, shard)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.writer_threads) as pool:
        list(pool.map(one, range(len(sizes)), sizes))
    res.seconds = time.perf_counter() - t0
    res.tokens = tokens
    res.notes.append(
        f"{total / 2**30:.2f} GiB in {len(sizes)} files, {args.writer_threads} threads: "
        f"{total / res.seconds / 1e9:.2f} GB/s"
    )
    shutil.rmtree(directory, ignore_errors=True)
    return res


def run_capture(
    backend,
    prompts,
    args,
    device,
    name: str,
    root: str | None,
    layer_ids,
    hidden,
    background: bool = False,
    instrument: bool = False,
    verify_after: bool = False,
) -> RunResult:
    """extract.py's capture loop: backend -> ShardWriter.add (root None: records are dropped,
    nothing written)."""
    import eagle3.store.writer as sw
    from eagle3.extraction.capture_loop import DropRecords, capture_into

    res = RunResult(name)
    warm = prompts[: args.batch_size]
    for _ in backend.capture_with_ids(warm):  # warm-up batch, not timed
        pass
    writer = open_writer(root, layer_ids, hidden, name, background, args) if root else None
    timers = Timers(device)
    if instrument:
        # syncs after each forward: the overlap of the host copy is lost in this run
        timers.wrap(backend, "_launch", "launch (forward + stack + checks + copy queued)")
        timers.wrap(backend.model, "forward", "forward", sync_device=True)
        timers.wrap(backend, "_finish", "finish (wait for the copy + adapter per row)")
        timers.wrap(sw, "write_shard", "write_shard (save + sha256 + fsync; writer thread if background)")
    sync(device)
    t0 = time.perf_counter()
    try:
        # extract.py's own capture loop (progress bar and throughput line included)
        res.tokens = capture_into(backend, prompts, writer if writer is not None else DropRecords()).tokens
        if writer is not None:
            t_close = time.perf_counter()
            writer.close()  # the last flush is part of the work
            res.breakdown_s["close (last shard, not overlapped)"] = round(time.perf_counter() - t_close, 3)
        res.seconds = time.perf_counter() - t0
    finally:
        timers.close()
        if writer is not None:
            writer.close()
    if instrument:
        b = dict(timers.seconds)
        launch = b.pop("launch (forward + stack + checks + copy queued)", 0.0)
        b["stack + checks + copy queued (launch - forward)"] = launch - b.get("forward", 0.0)
        res.breakdown_s.update({k: round(v, 3) for k, v in b.items()})
    if root:
        res.notes.append(f"wrote {res.tokens * len(layer_ids) * hidden * 2 / 2**30:.2f} GiB of hidden states")
        if verify_after:  # the digests taken while writing must match the files: full verification
            check = open_writer_existing(root, layer_ids, hidden, name, args)
            res.notes.append(
                f"reopened with verify=full: {len(check.manifest.shards)} shards, {len(check.dropped)} dropped"
            )
            check.close()
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return res


def run_vllm(target_dir, prompts, args, layer_ids, hidden, root) -> RunResult:
    res = RunResult("vllm")
    from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend

    t0 = time.perf_counter()
    engine = CaptureEngine(
        cpu_kvcache_space_gb=2, max_num_seqs=args.batch_size, max_model_len=args.seq + 8, gpu_memory_utilization=0.5
    )
    backend = VLLMCaptureBackend(target_dir, layer_ids, dtype=torch.bfloat16, engine=engine)
    res.notes.append(f"engine start-up {time.perf_counter() - t0:.1f} s (not timed)")
    try:
        r = run_capture(backend, prompts, args, torch.device("cpu"), "vllm", root, layer_ids, hidden)
    finally:
        backend.close()
    r.notes = res.notes + r.notes
    return r


# ----------------------------------------------------------------------------- main


def markdown(results: list[RunResult], header: str) -> str:
    plain = next((r for r in results if r.run == "plain" and r.status == "ok"), None)
    lines = [
        header,
        "",
        "| run | tokens | seconds | tokens/s | % of compute limit | vs plain forward | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        vs = f"{r.tokens_per_s / plain.tokens_per_s:.2f}x" if plain and r.status == "ok" else "-"
        lines.append(
            f"| {r.run} | {r.tokens} | {r.seconds:.2f} | {r.tokens_per_s:,.0f} | "
            f"{100 * r.fraction_of_limit:.1f}% | {vs} | {r.status} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        choices=("smollm2", "llama3-8b-random"),
        default=None,
        help="default: llama3-8b-random on CUDA, smollm2 on CPU",
    )
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--backends", nargs="+", default=["hf"], choices=("hf", "vllm"))
    runs = ("disk", "plain", "plain_d2h", "hf_nowrite", "hf", "hf_overlap", "hf_breakdown", "hf_1thread", "hf_sync")
    ap.add_argument("--runs", nargs="+", default=["disk", "plain", "hf_nowrite", "hf", "hf_1thread"], choices=runs)
    ap.add_argument("--batches", type=int, default=None, help="default 32 (GPU), 4 (CPU)")
    ap.add_argument("--writer-threads", type=int, default=None, help="ShardWriter threads; default 4 (GPU), 2 (CPU)")
    ap.add_argument("--shard-tokens", type=int, default=None, help="tokens per shard; default 16384 (GPU), 65536 (CPU)")
    ap.add_argument("--batch-size", type=int, default=None, help="prompts per forward; default 8 (GPU), 4 (CPU)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per prompt; default 2048 (GPU), 512 (CPU)")
    ap.add_argument("--shard-dir", default=None, help="where shards are written (default: a temp dir)")
    ap.add_argument(
        "--cache-dir",
        default=str(Path(__file__).resolve().parents[1] / ".cache"),
        help="materialised SmolLM2 lives here (default: the clone's .cache)",
    )
    ap.add_argument("--out", required=True, help="JSON results path")
    args = ap.parse_args()

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    gpu = device.type == "cuda"
    args.model = args.model or ("llama3-8b-random" if gpu else "smollm2")
    args.batches = args.batches or (32 if gpu else 4)
    args.writer_threads = args.writer_threads or (4 if gpu else 2)
    args.shard_tokens = args.shard_tokens or (16384 if gpu else 65536)
    args.batch_size = args.batch_size or (8 if gpu else 4)
    args.seq = args.seq or (2048 if gpu else 512)
    root = args.shard_dir or tempfile.mkdtemp(prefix="eagle3-bench-shards-")
    os.makedirs(root, exist_ok=True)
    start = time.perf_counter()

    peak = matmul_peak_tflops(device)
    best = max(peak.values())
    model, n_layers, params, target_dir = build_model(args, device)
    hidden = int(model.config.hidden_size)
    layer_ids = sorted({2, n_layers // 2, n_layers - 3, n_layers})
    limit = best * 1e12 / (2 * params)
    prompts = make_prompts(args, int(model.config.vocab_size))
    print(
        f"[{time.perf_counter() - start:5.1f}s] model ready; bf16 matmul peak {best:.2f} TFLOP/s, "
        f"limit {limit:,.0f} tok/s",
        flush=True,
    )
    results: list[RunResult] = []

    def save() -> None:  # after every run, so a timeout keeps what was measured
        import transformers

        doc = {
            "benchmark": "extract_throughput",
            "device": device_name(device),
            "model": args.model,
            "params_for_limit": params,
            "matmul_peak_tflops": peak,
            "compute_limit_tokens_per_s": limit,
            "layer_ids": layer_ids,
            "args": vars(args),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "results": [asdict(r) for r in results],
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    want_hf = "hf" in args.backends
    backend = hf_backend(model, target_dir, layer_ids, device, args) if want_hf else None
    for run in args.runs if want_hf else []:
        try:
            if run == "disk":
                r = run_disk(args, root, len(layer_ids) * hidden * 2)
            elif run.startswith("plain"):
                r = run_plain(model, prompts, layer_ids, args, device, run == "plain_d2h")
            else:
                backend.overlap_host_copy = run == "hf_overlap"
                r = run_capture(
                    backend,
                    prompts,
                    args,
                    device,
                    run,
                    None if run == "hf_nowrite" else root,
                    layer_ids,
                    hidden,
                    background=run in ("hf", "hf_overlap", "hf_breakdown", "hf_1thread"),
                    instrument=run == "hf_breakdown",
                    verify_after=run == "hf",
                )
        except Exception as e:
            r = RunResult(run, status=f"failed: {type(e).__name__}: {str(e)[:300]}")
        results.append(r)
        finish(r, limit)
        print(
            f"[{time.perf_counter() - start:5.1f}s] {r.run}: {r.status} {r.tokens_per_s:,.0f} tok/s "
            f"{r.breakdown_s or ''} {'; '.join(r.notes)}",
            flush=True,
        )
        save()
    if backend is not None:
        backend.close()
    del model, backend
    gc.collect()
    if "vllm" in args.backends:
        results.append(vllm_or_skip(target_dir, prompts, args, layer_ids, hidden, root, gpu))
        finish(results[-1], limit)
    header = (
        f"Device: {device_name(device)}; model {args.model} ({params / 1e9:.2f}B params for the limit); "
        f"{args.batches} x {args.batch_size} x {args.seq} tokens; capture ids {layer_ids}; "
        f"bf16 matmul peak {best:.2f} TFLOP/s -> limit {limit:,.0f} tok/s"
    )
    print(markdown(results, header))
    save()
    if not args.shard_dir:
        shutil.rmtree(root, ignore_errors=True)


def finish(r: RunResult, limit: float) -> None:
    if r.status == "ok" and r.seconds > 0:
        r.tokens_per_s = r.tokens / r.seconds
        r.fraction_of_limit = r.tokens_per_s / limit


def vllm_or_skip(target_dir, prompts, args, layer_ids, hidden, root, gpu) -> RunResult:
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, "..", "eagle3", "target_model", "capture_vllm.py")):
        return RunResult("vllm", status="skipped: eagle3/target_model/capture_vllm.py does not exist yet")
    if target_dir is None:
        return RunResult("vllm", status="skipped: vLLM needs a model directory (random in-memory model given)")
    try:
        import vllm  # noqa: F401
    except Exception as e:
        return RunResult("vllm", status=f"skipped: vllm does not import here ({type(e).__name__})")
    try:
        return run_vllm(target_dir, prompts, args, layer_ids, hidden, root)
    except Exception as e:
        return RunResult("vllm", status=f"failed: {type(e).__name__}: {str(e)[:300]}")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.machine()}, {torch.get_num_threads()} threads (shared with other jobs)"


if __name__ == "__main__":
    sys.exit(main())
