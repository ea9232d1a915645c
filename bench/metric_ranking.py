"""Does the validation figure rank heads as vLLM does? Several heads trained by train.py on one
dataset (other lengths, learning rates, TTT steps, norms), each measured three ways on the same
dataset and held-out prompts:

- ``val/sim_accept_len``: the uniform train-side estimate (every answer position starts a chain);
- ``val/replay_accept_len``: serving's drafting rounds replayed (``optimized_metric``, what the
  checkpoint callback and the Optuna search optimise);
- vLLM's acceptance length from its spec-decode counters (train.py's end-of-run evaluation on the
  validation split's opening turns + HumanEval, never trained on).

    python bench/metric_ranking.py --out outputs/ranking/ranking.json [--base experiment=demo_cpu] \
        [--work-dir outputs/ranking] [--heads N] [--eval-prompts 32 --humaneval 16]
    python bench/metric_ranking.py --variants gpu --base experiment=smollm2_full ... \
        --eval-args engine.enforce_eager=true        # a GPU: longer runs; eager engines start faster

Each head is trained with train.py (its end-of-run evaluation off), then measured by
``python evaluate.py`` with the head only (``baseline=false``: acceptance needs no target-alone
engine); ``--eval-args`` adds evaluate overrides (acceptance does not depend on CUDA graphs).

The train-side figures are those of the exported head (the best checkpoint), recomputed on the
whole validation split by ``python -m eagle3.stages.replay_export``. Prints per head the three
figures, then per train-side figure: Spearman and Kendall rank correlation with vLLM over the heads,
the mean and largest error against vLLM, and the pairs it orders the other way. Writes the JSON
and a scatter plot (``<out>.png``). A head whose run finished (summary.json, replay.json) is not
trained again: the bench resumes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# a spread of quality from one dataset: training length, peak lr, TTT steps, EAGLE-3.1 norms
VARIANTS: dict[str, list[list[str]]] = {
    "cpu": [  # experiment=demo_cpu: 1,024-token steps on a few cores
        ["train.max_steps=60"],
        ["train.max_steps=150", "train.lr=3e-4"],
        ["train.max_steps=150"],
        ["train.max_steps=300", "train.ttt_steps=1"],
        ["train.max_steps=300"],
        ["train.max_steps=300", "head.norm_before_fc=true", "head.norm_output=true"],
        ["train.max_steps=600", "train.lr=6e-4"],
        ["train.max_steps=600"],
    ],
    "gpu": [  # the GPU budget (8,192-token steps, ~35 steps/s for SmolLM2 on an H200)
        ["train.max_steps=150"],
        ["train.max_steps=500", "train.lr=3e-4"],
        ["train.max_steps=500", "train.ttt_steps=1"],
        ["train.max_steps=1500", "head.norm_before_fc=false", "head.norm_output=false"],
        ["train.max_steps=1500"],
        ["train.max_steps=4000"],
    ],
}


def run(cmd: list[str], log: Path) -> None:
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); {log}:\n{tail}")


def head_figures(i: int, overrides: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Train (or reuse) head i and measure it: vLLM from summary.json, train-side from replay.json."""
    run_dir = Path(args.work_dir) / f"head{i}"
    summary_file, replay_file = run_dir / "summary.json", run_dir / "replay.json"
    if not summary_file.is_file():
        t0 = time.perf_counter()
        cmd = [sys.executable, "train.py", *args.base, *overrides, f"hydra.run.dir={run_dir}", "logger=none"]
        run_dir.mkdir(parents=True, exist_ok=True)
        run([*cmd, "eval.enabled=false"], run_dir.parent / f"head{i}.train.log")
        print(f"head {i} ({' '.join(overrides)}): trained in {time.perf_counter() - t0:.0f} s", flush=True)
    summary = json.loads(summary_file.read_text())
    acceptance_file = run_dir / "acceptance" / "acceptance.json"
    if not acceptance_file.is_file():
        t0 = time.perf_counter()
        cmd = [
            sys.executable,
            "evaluate.py",
            f"export_dir={summary['export_dir']}",
            f"out_dir={acceptance_file.parent}",
        ]
        cmd += [f"dataset_dir={summary['dataset_dir']}", f"target={summary['target_dir']}", "baseline=false"]
        cmd += [f"eval.max_prompts={args.eval_prompts}", f"eval.humaneval_prompts={args.humaneval}", *args.eval_args]
        run(cmd, run_dir.parent / f"head{i}.eval.log")
        print(f"head {i}: measured by vLLM in {time.perf_counter() - t0:.0f} s", flush=True)
    if not replay_file.is_file():
        cmd = [sys.executable, "-m", "eagle3.stages.replay_export", f"export_dir={summary['export_dir']}"]
        cmd += [f"dataset_dir={summary['dataset_dir']}", f"target={summary['target_dir']}", f"out={replay_file}"]
        run(cmd, run_dir.parent / f"head{i}.replay.log")
    replay = json.loads(replay_file.read_text())
    vllm = json.loads(acceptance_file.read_text())
    return {
        "overrides": overrides,
        "steps": summary.get("global_step"),
        "sim": replay[next(k for k in replay if k.startswith("sim_accept_len_k"))],
        "replay": replay["replay_accept_len"],
        "vllm": vllm["mean_acceptance_length"],
        "vllm_by_source": {k: v.get("mean_acceptance_length") for k, v in (vllm.get("by_source") or {}).items()},
    }


def ranks(values: list[float]) -> list[float]:
    """Average ranks (ties share the mean of their places)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def kendall(a: list[float], b: list[float]) -> tuple[float, list[tuple[int, int]]]:
    """(tau-a, the pairs ordered the other way)."""
    swapped, agree = [], 0
    for i, j in itertools.combinations(range(len(a)), 2):
        s = (a[i] - a[j]) * (b[i] - b[j])
        if s > 0:
            agree += 1
        elif s < 0:
            swapped.append((i, j))
    pairs = len(a) * (len(a) - 1) // 2
    return (agree - len(swapped)) / pairs, swapped


def agreement(heads: list[dict[str, Any]], key: str, against: str | None = None) -> dict[str, Any]:
    """``key``'s figure against vLLM's over all held-out prompts, or over one source of them
    (``against="val"``: the validation split's opening turns, the train-side figures' own prompts)."""
    est = [h[key] for h in heads]
    ref = [h["vllm_by_source"][against] if against else h["vllm"] for h in heads]
    errors = [e - r for e, r in zip(est, ref)]
    tau, swapped = kendall(est, ref)
    return {
        "spearman": spearman(est, ref),
        "kendall_tau": tau,
        "swapped_pairs": swapped,
        "mean_error": sum(errors) / len(errors),  # signed: above 0 the figure overstates vLLM
        "mean_abs_error": sum(abs(e) for e in errors) / len(errors),
        "max_abs_error": max(abs(e) for e in errors),
    }


def plot(heads: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ref = [h["vllm"] for h in heads]
    for key, marker in (("sim", "o"), ("replay", "s")):
        ax.scatter(ref, [h[key] for h in heads], marker=marker, label=f"val/{key}_accept_len")
    lo, hi = min(ref + [h["sim"] for h in heads]) - 0.05, max(ref + [h["sim"] for h in heads]) + 0.05
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    ax.set_xlabel("vLLM acceptance length (held-out prompts)")
    ax.set_ylabel("train-side figure on the validation split")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", nargs="*", default=["experiment=demo_cpu"], help="overrides every head shares")
    ap.add_argument(
        "--variants", choices=sorted(VARIANTS), default="cpu", help="the set of heads (sizes for the machine)"
    )
    ap.add_argument("--heads", type=int, default=None, help="the first N of the set (default: all)")
    ap.add_argument(
        "--eval-args", nargs="*", default=[], help="overrides for evaluate.py (e.g. engine.enforce_eager=true)"
    )
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--humaneval", type=int, default=16)
    ap.add_argument("--work-dir", default="outputs/ranking")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    variants = VARIANTS[args.variants][: args.heads]
    if len(variants) < 3:
        raise SystemExit(f"--heads: a ranking needs 3 heads at least, got {len(variants)}")

    heads = [head_figures(i, overrides, args) for i, overrides in enumerate(variants)]
    print("| head | overrides | steps | val sim | val replay | vLLM |")
    print("|---|---|---|---|---|---|")
    for i, h in enumerate(heads):
        print(
            f"| {i} | {' '.join(h['overrides'])} | {h['steps']} | {h['sim']:.3f} | {h['replay']:.3f} | {h['vllm']:.3f} |"
        )
    result: dict[str, Any] = {"base": args.base, "variants": args.variants, "heads": heads}
    for key, against in (("sim", None), ("replay", None), ("sim", "val"), ("replay", "val")):
        a = result[key if against is None else f"{key}_vs_{against}"] = agreement(heads, key, against)
        prompts = "all held-out prompts" if against is None else f"its {against} prompts"
        print(
            f"val/{key}_accept_len against vLLM on {prompts} over {len(heads)} heads: Spearman {a['spearman']:.3f}, "
            f"Kendall {a['kendall_tau']:.3f} ({len(a['swapped_pairs'])} pairs the other way: {a['swapped_pairs']}); "
            f"error {a['mean_error']:+.3f} on average, |error| <= {a['max_abs_error']:.3f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(heads, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
