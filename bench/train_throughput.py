"""Training-step throughput and peak memory: eagle3's draft head vs speculators 0.9's.

One optimisation step on one packed sequence, identical shapes, weights and inputs for
both: fp32 master weights, bf16 autocast, AdamW, grad-norm clip 1.0 (what speculators'
trainer does). Variants (run in the order given, each at every --ttt):

    ours             eagle3.draft as shipped (dense bool SDPA mask), eager
    ours_compiled    the same step (head + target logits + loss) under torch.compile
    ours_frozen_lm   ours with lm_head frozen, as speculators 0.9 trains (like for like)
    ours_flex        eagle3's attention="flex" (eagle3/draft/flex.py): block-sparse flex
                     attention instead of the dense [B,1,T,T*K] mask, flex_attention compiled
    ours_flex_compiled  the same with the whole step compiled (train.compile + train.attention=flex)
    spec             speculators Eagle3DraftModel + its eager loss, compiled as its trainer
                     runs it (its forward carries @conditional_torch_compile on CUDA)
    spec_eager       the same, uncompiled (torch.compiler.set_stance("force_eager"))
    spec_fused       speculators with its default fused Triton loss (GPU only)

    python bench/train_throughput.py --preset cpu-small --out results.json
    python bench/train_throughput.py --preset llama3-8b --ttt 3 7 --out results.json

Model FLOPs count the matmuls of forward + backward (attention as causal: the useful
work, whatever a kernel actually computes), so TFLOP/s compares variants honestly.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import torch
from harness import target_config
from speculators_peer import build_spec, import_speculators, spec_loss_fn


def _preset(model: str, draft_vocab: int, seq: int) -> dict:
    """A target's shapes from conf/model/<model>.yaml (bench/harness.py) and the bench's sizes."""
    t = target_config(model)
    return dict(
        hidden=t["hidden_size"],
        heads=t["num_attention_heads"],
        kv_heads=t["num_key_value_heads"],
        intermediate=t["intermediate_size"],
        vocab=t["vocab_size"],
        draft_vocab=draft_vocab,
        seq=seq,
    )


PRESETS = {
    "cpu-small": dict(hidden=256, heads=4, kv_heads=2, intermediate=1024, vocab=8192, draft_vocab=2048, seq=512),
    "llama3-8b": _preset("llama3_1_8b", draft_vocab=32000, seq=2048),
}
ALL_VARIANTS = (
    "ours",
    "spec",
    "spec_eager",
    "ours_frozen_lm",
    "ours_compiled",
    "ours_flex",
    "spec_fused",
    "ours_flex_compiled",
)
COMPILED = {"ours_compiled", "ours_flex", "ours_flex_compiled", "spec", "spec_fused"}
LLAMA = target_config("llama3_1_8b")  # both heads' norm and positions are Llama-3.1-8B's, every preset
ROPE_THETA = 500000.0
EPS = LLAMA["rms_norm_eps"]
MAX_POSITIONS = LLAMA["max_position_embeddings"]


@dataclass
class Shapes:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    draft_vocab: int
    seq: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass
class RunResult:
    variant: str
    ttt: int
    status: str = "ok"  # ok | skipped: why | failed: error
    tokens_per_s: float = 0.0
    step_ms: float = 0.0  # median of the timed steps
    step_ms_min: float = 0.0
    peak_mem_gib: float = 0.0  # allocator (CUDA) or RSS (CPU) peak above what was held before the build
    first_steps_s: float = 0.0  # warm-up incl. compilation
    model_tflop_per_step: float = 0.0
    achieved_tflops: float = 0.0
    loss: float = float("nan")
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- FLOPs


def step_flops(s: Shapes, ttt: int, train_lm_head: bool) -> float:
    """Matmul FLOPs of one training step (forward + backward), attention counted causal."""
    h, t, hd = s.hidden, s.seq, s.head_dim
    layer = 2 * h * s.heads * hd + 2 * 2 * h * s.kv_heads * hd + s.heads * hd * h + 3 * h * s.intermediate
    lm = h * s.draft_vocab
    fwd_layer = 2 * t * layer
    fwd_lm = 2 * t * lm
    # attention at step k: causal over step-0 keys + k diagonal keys, QK^T and PV
    attn = sum(2 * 2 * s.heads * hd * (t * (t + 1) / 2 + k * t) for k in range(ttt))
    total = ttt * (3 * fwd_layer + (3 if train_lm_head else 2) * fwd_lm) + 3 * attn
    total += 2 * (2 * t * 3 * h * h)  # fc: forward + weight grad (its input needs no grad)
    total += 2 * t * h * s.draft_vocab  # frozen target lm_head rows, forward only
    return float(total)


# ----------------------------------------------------------------------------- inputs


def make_inputs(s: Shapes, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """One packed row of 3 samples, random hidden states and frozen target weights."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = s.seq
    lengths = [int(t * 0.4), int(t * 0.35)]
    lengths.append(t - sum(lengths))
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    cpu = dict(
        input_ids=torch.randint(0, s.vocab, (1, t), generator=g),
        segment_ids=seg,
        position_ids=pos,
        loss_mask=torch.rand(1, t, generator=g) < 0.7,
        aux_hidden=torch.randn(1, t, 3 * s.hidden, generator=g).to(torch.bfloat16),
        final_hidden=torch.randn(1, t, s.hidden, generator=g).to(torch.bfloat16),
    )
    out = {k: v.to(device) for k, v in cpu.items()}
    gd = torch.Generator(device=device).manual_seed(seed + 1)
    out["embed"] = torch.randn(s.vocab, s.hidden, device=device, generator=gd) * 0.02
    out["lm_rows"] = torch.randn(s.draft_vocab, s.hidden, device=device, generator=gd) * 0.02
    t2d = torch.zeros(s.vocab, dtype=torch.bool)
    t2d[: s.draft_vocab] = True  # draft ids = the first V target ids
    out["t2d"], out["d2t"] = t2d, torch.zeros(s.draft_vocab, dtype=torch.int64)
    return out


# ----------------------------------------------------------------------------- our step


def build_ours(s: Shapes, x: dict, device: torch.device, frozen_lm: bool):
    from eagle3.draft import DraftConfig, Eagle3DraftHead

    cfg = DraftConfig(
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        intermediate_size=s.intermediate,
        target_vocab_size=s.vocab,
        draft_vocab_size=s.draft_vocab,
        rope_theta=ROPE_THETA,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=EPS,
    )
    with torch.device(device):
        head = Eagle3DraftHead(cfg)
    full = torch.zeros(s.vocab, s.hidden, device=device)
    full[: s.draft_vocab] = x["lm_rows"]
    head.load_target_weights(
        x["embed"], torch.ones(s.hidden, device=device), full, x["d2t"], x["t2d"], init_lm_head_from_target=True
    )
    del full
    if frozen_lm:
        head.lm_head.weight.requires_grad_(False)
    return head


def ours_loss_fn(head, ttt: int):
    from eagle3.draft import eagle3_loss

    def forward_loss(x: dict) -> torch.Tensor:
        logits = head(x["aux_hidden"], x["input_ids"], x["position_ids"], x["segment_ids"], ttt)
        with torch.no_grad():
            target, covered = head.teacher_logits(x)
        loss, _ = eagle3_loss(
            logits,
            target,
            loss_mask=x["loss_mask"],
            segment_ids=x["segment_ids"],
            step_decay=1.0,
            kind="forward_kl",
            covered=covered,
        )
        return loss

    return forward_loss


# ----------------------------------------------------------------------------- flex prototype
# PROTOTYPE, measured here only: block-sparse flex attention for the TTT mask. It replaces
# build_ttt_mask / ttt_step_mask in eagle3.draft.head and TTTAttention.forward while the
# variant runs, then restores them. Keys are zero-padded to K*T so one compiled kernel
# serves every step; blocks past step k are absent from the block mask, never computed.


class _compiled_flex_kernel:
    """Reusable context: eagle3.draft.flex calls torch's flex_attention; inside, a compiled copy."""

    def __init__(self):
        import torch.nn.attention.flex_attention as fa

        self.module, self.original = fa, fa.flex_attention
        self.compiled = torch.compile(self.original, dynamic=False)

    def __enter__(self):
        self.module.flex_attention = self.compiled

    def __exit__(self, *exc):
        self.module.flex_attention = self.original


@torch.no_grad()
def flex_equivalence(head, x: dict, ttt: int) -> str:
    """Max |logits difference| between attention="flex" and the dense mask (same head)."""
    device_type = x["aux_hidden"].device.type
    args = (x["aux_hidden"], x["input_ids"], x["position_ids"], x["segment_ids"], ttt)
    with torch.autocast(device_type, dtype=torch.bfloat16):
        head.attention = "flex"
        flex = head(*args)
        head.attention = "sdpa"
        dense = head(*args)
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(flex, dense))
    scale = max(float(b.float().abs().max()) for b in dense)
    return f"flex vs dense draft logits: max abs diff {diff:.3g} for logits up to {scale:.3g}"


# ----------------------------------------------------------------------------- timing


class RSSPeak:
    """Peak resident memory of this process while active, sampled every 2 ms (CPU runs)."""

    def __init__(self):
        import psutil

        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.base


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Prepared:
    """A built, warmed-up variant: call `step()` to run one timed optimisation step."""

    res: RunResult
    model: torch.nn.Module | None = None
    step: object = None
    times: list[float] = field(default_factory=list)
    held_bytes: int = 0  # CUDA memory held before the build (other runs' leftovers)


def make_step(model, forward_loss, x, device):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)

    def one_step() -> torch.Tensor:  # speculators' trainer order: forward, zero_grad, backward, clip, step
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward_loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.detach()

    return one_step


def prepare(variant: str, ttt: int, s: Shapes, x: dict, device: torch.device, args) -> Prepared:
    """Build the variant and run its warm-up steps (compilation happens there)."""
    p = Prepared(RunResult(variant, ttt))
    res = p.res
    if variant == "spec_fused" and device.type != "cuda":
        res.status = "skipped: the fused loss is a Triton kernel (GPU only)"
        return p
    gc.collect()
    p.held_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    rss = RSSPeak() if device.type == "cpu" else None
    patch = None
    try:
        if variant.startswith("ours"):
            p.model = build_ours(s, x, device, frozen_lm=variant == "ours_frozen_lm")
            fl = ours_loss_fn(p.model, ttt)
            if "flex" in variant:
                res.notes.append(flex_equivalence(p.model, x, ttt))
                if device.type == "cpu":
                    res.status = "skipped: flex attention has no backward on CPU (forward checked)"
                    return p
                p.model.attention = "flex"
                if variant == "ours_flex":  # only the kernel compiled, the rest of the step eager
                    patch = _compiled_flex_kernel()
            if variant in ("ours_compiled", "ours_flex_compiled"):
                fl = torch.compile(fl)
            train_lm = variant != "ours_frozen_lm"
        else:
            attn = (
                args.spec_attn
                if args.spec_attn != "auto"
                else ("simple_flex_attention" if device.type == "cuda" else "sdpa")
            )
            if attn != "simple_flex_attention":
                res.notes.append(f"attention {attn} (flex attention has no backward on CPU)")
            p.model = build_spec(s, x, device, ttt, attn, eps=EPS, rope_theta=ROPE_THETA, max_positions=MAX_POSITIONS)
            eager = variant == "spec_eager"
            fl = spec_loss_fn(p.model, ttt, "fused" if variant == "spec_fused" else "eager", eager)
            if device.type == "cpu" and not eager:  # its decorator compiles on CUDA only
                fl = torch.compile(fl)
                res.notes.append("compiled explicitly (speculators compiles only when CUDA is present)")
            train_lm = False  # speculators 0.9 freezes lm_head (load_verifier_weights)
        res.model_tflop_per_step = step_flops(s, ttt, train_lm) / 1e12
        one_step = make_step(p.model, fl, x, device)

        def step() -> torch.Tensor:
            with patch if patch else contextlib.nullcontext():
                return one_step()

        t0 = time.perf_counter()
        for _ in range(args.warmup):
            loss = step()
        sync(device)
        res.first_steps_s = time.perf_counter() - t0
        res.loss = float(loss)
        p.step = step
    except Exception as e:  # one variant failing must not lose the others
        res.status = f"failed: {type(e).__name__}: {str(e)[:400]}"
    finally:
        if rss is not None:
            res.peak_mem_gib = rss.stop() / 2**30
    return p


def measure(p: Prepared, steps: int, device: torch.device) -> None:
    if p.step is None:
        return
    try:
        for _ in range(steps):
            t1 = time.perf_counter()
            p.step()
            sync(device)
            p.times.append(time.perf_counter() - t1)
    except Exception as e:
        p.res.status = f"failed: {type(e).__name__}: {str(e)[:400]}"
        p.step = None


def finish(p: Prepared, s: Shapes, device: torch.device) -> RunResult:
    res = p.res
    if res.status == "ok" and p.times:
        res.step_ms = 1000 * statistics.median(p.times)
        res.step_ms_min = 1000 * min(p.times)
        res.tokens_per_s = s.seq / (res.step_ms / 1000)
        res.achieved_tflops = res.model_tflop_per_step / (res.step_ms / 1000)
        if device.type == "cuda":
            res.peak_mem_gib = (torch.cuda.max_memory_allocated(device) - p.held_bytes) / 2**30
    return res


def release(p: Prepared, device: torch.device) -> None:
    p.model = p.step = None
    gc.collect()
    if p.res.variant in COMPILED:
        torch._dynamo.reset()  # drop guards and graphs that reference the model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def profile_steps(step, device) -> dict:
    """Device time by kernel family over 2 steps (torch.profiler), and the largest kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        sync(device)
    kernels = [
        (e.key, e.self_device_time_total / 2e3)
        for e in prof.key_averages()
        if e.self_device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA
    ]
    families = {
        "gemm": ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas"),
        "attention": ("fmha", "flash", "attention", "flex", "triton_tem"),
        "softmax/loss": ("softmax", "logsumexp", "kl_div", "log_", "nll", "reduce"),
    }
    out = {k: 0.0 for k in families} | {"other": 0.0}
    for name, ms in kernels:
        low = name.lower()
        fam = next((f for f, keys in families.items() if any(k in low for k in keys)), "other")
        out[fam] += ms
    top = sorted(kernels, key=lambda kv: -kv[1])[:10]
    return {
        "ms_per_step_by_family": {k: round(v, 2) for k, v in out.items()},
        "top_kernels_ms_per_step": [[n[:100], round(ms, 2)] for n, ms in top],
    }


def run_sequential(jobs, shapes, device, args, on_result, start) -> None:
    """GPU: one variant at a time, so each has the device (and its memory peak) to itself."""
    warmups: dict[str, tuple[float, int]] = {}  # variant -> (its last warm-up incl. compile, at TTT)
    for variant, ttt in jobs:
        elapsed = time.perf_counter() - start
        # compile time grows about linearly with the unrolled TTT steps; a compiled variant not
        # seen yet costs about as much as the slowest compile so far
        compiled_seen = [w / t * ttt for v, (w, t) in warmups.items() if v in COMPILED]
        if variant in warmups:
            guess = warmups[variant][0] / warmups[variant][1] * ttt
        else:
            guess = max(compiled_seen, default=60.0) if variant in COMPILED else 10.0
        if args.budget_s and elapsed + guess > args.budget_s:
            on_result(
                RunResult(variant, ttt, status=f"skipped: time budget ({elapsed:.0f} s used, ~{guess:.0f} s needed)")
            )
            continue
        x = make_inputs(shapes, device)
        p = prepare(variant, ttt, shapes, x, device, args)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        measure(p, args.steps, device)
        res = finish(p, shapes, device)
        if (
            args.profile
            and p.step is not None
            and device.type == "cuda"
            and ttt == max(args.ttt)
            and variant in ("ours", "spec", "ours_flex")
        ):
            try:
                res.notes.append("profile: " + json.dumps(profile_steps(p.step, device)))
            except Exception as e:
                res.notes.append(f"profile failed: {type(e).__name__}: {e}")
        warmups[variant] = (res.first_steps_s + 2.0, ttt)
        release(p, device)
        del x
        on_result(res)


def run_interleaved(jobs, shapes, device, args, on_result, start) -> None:
    """CPU (shared, noisy): all variants of one TTT built, then timed round-robin in
    rounds, so load from other processes hits every variant alike."""
    for ttt in args.ttt:
        x = make_inputs(shapes, device)
        preps = [prepare(v, t, shapes, x, device, args) for v, t in jobs if t == ttt]
        for _ in range(args.rounds):
            for p in preps:
                measure(p, max(1, args.steps // args.rounds), device)
        for p in preps:
            on_result(finish(p, shapes, device))
            release(p, device)


# ----------------------------------------------------------------------------- report


def markdown(results: list[RunResult], device_name: str) -> str:
    base = {r.ttt: r for r in results if r.variant == "spec" and r.status == "ok"}
    lines = [
        f"Device: {device_name}",
        "",
        "| variant | TTT | tokens/s | step ms (median) | peak GiB | model TFLOP/step | TFLOP/s | "
        "vs spec compiled | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ok = r.status == "ok" and r.tokens_per_s > 0
        ratio = f"{r.tokens_per_s / base[r.ttt].tokens_per_s:.2f}x" if r.ttt in base and ok else "-"
        lines.append(
            f"| {r.variant} | {r.ttt} | {r.tokens_per_s:,.0f} | {r.step_ms:.1f} | {r.peak_mem_gib:.2f} | "
            f"{r.model_tflop_per_step:.3f} | {r.achieved_tflops:.1f} | {ratio} | {r.status} |"
        )
    return "\n".join(lines)


def write_json(path, shapes, device_name, stood_in, results, args) -> None:
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    if "speculators" in sys.modules:
        versions["speculators"] = getattr(sys.modules["speculators"], "__version__", "?")
    doc = {
        "benchmark": "train_throughput",
        "device": device_name,
        "shapes": asdict(shapes),
        "versions": versions,
        "args": vars(args),
        "stand_in_modules_for_speculators_import": stood_in,
        "results": [asdict(r) for r in results],
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    for name in ("hidden", "heads", "kv_heads", "intermediate", "vocab", "draft_vocab", "seq"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="override the preset")
    ap.add_argument("--ttt", type=int, nargs="+", default=[3])
    ap.add_argument("--variants", nargs="+", default=list(ALL_VARIANTS), choices=ALL_VARIANTS)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument(
        "--spec-attn",
        default="auto",
        choices=("auto", "simple_flex_attention", "sdpa"),
        help="speculators' draft attention (auto: flex on CUDA, sdpa on CPU)",
    )
    ap.add_argument("--warmup", type=int, default=3, help="steps before timing (compilation happens here)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="> 0: time variants round-robin in this many rounds; 0: one after another (default: 5 on CPU, 0 on GPU)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="one after another: skip runs that would end after this many s (estimated)",
    )
    ap.add_argument("--profile", action="store_true", help="torch.profiler breakdown (CUDA) at the largest TTT")
    ap.add_argument("--out", required=True, help="JSON results path")
    args = ap.parse_args()

    shapes = Shapes(
        **{k: getattr(args, k) if getattr(args, k) is not None else v for k, v in PRESETS[args.preset].items()}
    )
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    if args.rounds is None:
        args.rounds = 5 if device.type == "cpu" else 0
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    stood_in = import_speculators() if any(v.startswith("spec") for v in args.variants) else []
    device_name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU {platform.machine()}, {torch.get_num_threads()} threads (shared with other jobs)"
    )
    start = time.perf_counter()
    results: list[RunResult] = []

    def on_result(r: RunResult) -> None:
        results.append(r)
        print(
            f"[{time.perf_counter() - start:6.1f}s] {r.variant} ttt={r.ttt}: {r.status} "
            f"{r.tokens_per_s:,.0f} tok/s, {r.peak_mem_gib:.2f} GiB, warm-up {r.first_steps_s:.1f}s "
            f"{'; '.join(r.notes)[:1500]}",
            flush=True,
        )
        write_json(args.out, shapes, device_name, stood_in, results, args)

    jobs = [(v, t) for v in args.variants for t in args.ttt]
    (run_interleaved if args.rounds > 0 else run_sequential)(jobs, shapes, device, args, on_result, start)
    print(markdown(results, device_name))


if __name__ == "__main__":
    main()
