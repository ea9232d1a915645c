"""Capture on a CPU: the target forward in bf16 against fp32, both storing bf16 records, on the
same real SmolLM2 and ShareGPT samples in one run, and which one eagle3 picks on this CPU
(eagle3/target_model/compute_dtype.py). A CPU without native bf16 matmuls (no avx512_bf16 / AMX)
emulates bf16; ``--emulate-no-bf16`` re-runs the measurement in a subprocess with oneDNN and
ATen capped to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2), which is how such a
CPU computes, so both kinds are measured on one machine.

    python bench/cpu_capture_dtype.py [--samples 48] [--emulate-no-bf16] [--out results.json]

Prints tok/s per compute dtype, the ratio, and the dtype `compute_dtype` chooses here; the
rates in eagle3/planning/cost.py (capture_tok_s, capture_fp32_tok_s) come from this bench.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/cpu_capture_dtype.py` from anywhere
    sys.path.insert(0, str(ROOT))

CAPTURE_IDS = (2, 15, 27, 30)
CAP_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def measure(samples: int, max_length: int) -> dict:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from eagle3.data.pipeline import ChatSource, prepare_samples
    from eagle3.target_model.capture_hf import HFCaptureBackend
    from eagle3.target_model.compute_dtype import compute_dtype, cpu_flags
    from eagle3.target_model.resolve import materialize_smollm2

    target_dir = materialize_smollm2(ROOT / ".cache")
    tok = AutoTokenizer.from_pretrained(target_dir)
    data = prepare_samples(
        ChatSource("sharegpt"), tok, max_samples=samples, max_length=max_length,
        overflow="truncate", val_fraction=0.0, seed=0, progress=False,
    )  # fmt: skip
    feed = [(s.id, s.input_ids, s.loss_mask) for s in data.train]
    tokens = sum(int(s.input_ids.numel()) for s in data.train)
    rates = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        model = AutoModel.from_pretrained(target_dir, dtype=dtype)  # the base model, as capture loads it
        with HFCaptureBackend(target_dir, CAPTURE_IDS, dtype=torch.bfloat16, model=model) as backend:
            list(backend.capture_with_ids(feed[:2]))  # first-call costs out of the timing
            t0 = time.perf_counter()
            records = list(backend.capture_with_ids(feed))
            seconds = time.perf_counter() - t0
        assert all(r.hidden.dtype == torch.bfloat16 for _, r in records)  # stored bf16 either way
        rates[name] = tokens / seconds
        print(f"  forward in {name}: {rates[name]:,.0f} tok/s ({tokens:,} tokens, {seconds:.1f} s)", flush=True)
    flags = cpu_flags()
    return {
        "isa_cap": {k: os.environ[k] for k in CAP_AVX2 if k in os.environ},
        "native_bf16_flags": sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16")),
        "torch_threads": torch.get_num_threads(),
        "tokens": tokens,
        "tok_s": rates,
        "fp32_over_bf16": rates["fp32"] / rates["bf16"],
        "eagle3_computes_in": str(compute_dtype(torch.bfloat16, "cpu")).removeprefix("torch."),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--emulate-no-bf16", action="store_true", help="also measure with oneDNN/ATen capped to AVX2")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.samples, args.max_length)))
        return
    print("this CPU as it is:")
    results = {"native": measure(args.samples, args.max_length)}
    if args.emulate_no_bf16:
        print(f"capped to AVX2 ({' '.join(f'{k}={v}' for k, v in CAP_AVX2.items())}):")
        cmd = [sys.executable, __file__, "--child", f"--samples={args.samples}", f"--max-length={args.max_length}"]
        proc = subprocess.run(cmd, env={**os.environ, **CAP_AVX2}, capture_output=True, text=True, check=True)
        print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("  ")))
        results["avx2_cap"] = json.loads(proc.stdout.strip().splitlines()[-1])
    print("| CPU | bf16 forward tok/s | fp32 forward tok/s | fp32 / bf16 | eagle3 computes in |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['tok_s']['bf16']:,.0f} | {r['tok_s']['fp32']:,.0f} | {r['fp32_over_bf16']:.2f}x | {r['eagle3_computes_in']} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
