"""The capture-side finite check: the [T, L, H] mask (``torch.isfinite(h).all()``, what the
adapter did) against the extremes first (``torch.aminmax``, what
``eagle3.target_model.adapter.check_hidden_finite`` does, the store reader's way), on finite
hidden states of one sample at a few widths. Prints a markdown table; the ratio is mask / aminmax.

    python bench/finite_check.py --tokens 2048 --layers 4 --widths 576,4096,7168 --out outputs/bench/finite_check.json
"""

from __future__ import annotations

import argparse
import time

import torch
from harness import add_out, ints, write_json  # beside this file; puts the checkout on sys.path

from eagle3.target_model.adapter import CaptureSpec, check_hidden_finite


def _mask_check(h: torch.Tensor) -> bool:
    return bool(torch.isfinite(h).all())


def _best_s(repeats: int, fn, *args) -> float:
    fn(*args)  # warm: allocator, thread pool
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--widths", type=ints, default=[576, 4096, 7168])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--repeats", type=int, default=20)
    add_out(ap, required=False)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for width in args.widths:
        h = torch.randn(args.tokens, args.layers, width).to(dtype)
        spec = CaptureSpec(tuple(range(args.layers)), width, dtype, args.tokens)
        mask_s = _best_s(args.repeats, _mask_check, h)
        new_s = _best_s(args.repeats, check_hidden_finite, h, spec)
        rows.append({"width": width, "mask_ms": mask_s * 1e3, "aminmax_ms": new_s * 1e3, "ratio": mask_s / new_s})
    print(
        f"[T={args.tokens}, L={args.layers}, H] {args.dtype}, best of {args.repeats}, {torch.get_num_threads()} threads"
    )
    print("| H | mask ms | aminmax ms | mask / aminmax |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['width']} | {r['mask_ms']:.2f} | {r['aminmax_ms']:.2f} | {r['ratio']:.1f}x |")
    write_json(args.out, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
