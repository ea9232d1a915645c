"""The host side of train.py's GPU loader on a real dataset: each batch's samples read as stored
(``HiddenStateDataset.encoded_rows()``, finite check included) and collated into one packed row of
``--max-tokens`` (the compiled step's fixed shape), in this process: what the read-ahead thread does
per step while the GPU runs. Reports ms per batch for each pass (the first reads from the page
cache cold) and tokens/s at the fastest pass.

    python bench/read_collate.py <datasets dir or dataset dir> [--max-tokens 32768] [--passes 4]

Compare two checkouts on the same dataset, back to back: PYTHONPATH=<checkout> python
<checkout>/bench/read_collate.py <dir> (docs/records/2026-12-05-storage-formats.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness import ROOT  # beside this file; puts the checkout on sys.path

from eagle3.store import HiddenStateDataset
from eagle3.store.packing import collate_rows, pack_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=Path, help="a dataset dir, or a datasets dir holding one")
    ap.add_argument("--max-tokens", type=int, default=32768, help="train.max_tokens_per_batch")
    ap.add_argument("--passes", type=int, default=4)
    args = ap.parse_args()
    d = args.dataset
    if not (d / "manifest.json").is_file():
        found = sorted(p.parent for p in d.glob("*/manifest.json"))
        if len(found) != 1:
            ap.error(f"{d}: expected one dataset (a manifest.json in it or one level down), got {len(found)}")
        d = found[0]
    ds = HiddenStateDataset(d).encoded_rows()
    batches = pack_rows([int(n) for n in ds.lengths], args.max_tokens, None)
    ms = []
    for _ in range(args.passes):
        t = time.perf_counter()
        for b in batches:
            collate_rows([ds[i] for i in b], args.max_tokens, None, True, split=False)
        ms.append((time.perf_counter() - t) / len(batches) * 1e3)
    tokens = int(ds.lengths.sum()) / len(batches)
    print(f"checkout {ROOT}; {d.name}: storage {ds.storage}, {len(batches)} batches")
    print(f"ms per batch by pass: {[round(x, 1) for x in ms]}; {tokens / min(ms) * 1e3:,.0f} tok/s at the fastest")


if __name__ == "__main__":
    main()
