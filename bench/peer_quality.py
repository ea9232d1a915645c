"""Ours against speculators 0.9 at equal budget: one dataset, the same wall-clock minutes of
training on one GPU, then the same measurements of both exports.

    python bench/peer_quality.py train-peer --dataset-dir <dir> --minutes 6 --out /tmp/run-peer   # GPU
    python bench/peer_quality.py replay --export-dir <run>/export --dataset-dir <dir> --out <run>/replay.json
    python bench/peer_quality.py tokens --run-dir <train.py run dir> --out <run>/tokens.json         # GPU
    python bench/peer_quality.py table --run ours=<run> --run peer=<run> --dataset-dir <dir with manifest.json> \
        --target .cache/targets/<target>                                                           # CPU, vLLM

train-peer is bench/peer_train.py (speculators' model and loss, its recipe); ours is train.py with
train.max_time, run beside it on the same GPU for the same minutes.

replay: the val-split replay of any export (eagle3.evaluation.diagnostics.head_replay.train_side_figures: rounds as
serving runs them, K draft tokens, answers cut at --max-answer-tokens). Our head cannot represent
speculators' EAGLE-3.1 norms (norm_output, norm_before_residual) or sliding windows, so an export
that uses them is replayed by speculators' own model behind eagle3's head interface
(SpeculatorsHead): same samples, same rounds, same counting. Needs the dataset's shards (GPU).

tokens: real (unpadded) tokens a train.py run trained on, recounted from its config, step count
and the deterministic packed-batch stream (train.py does not record the total).

table: for each run directory (export/, peer_train.json or summary.json + tokens.json,
replay.json), runs `python evaluate.py` here (the held-out prompts: the validation split's
opening turns, then HumanEval; the same for every run) unless <run>/acceptance/acceptance.json
exists, and writes one table (markdown + JSON): tokens trained, optimizer steps, val replay, vLLM
mean acceptance length and per-position acceptance, and the ratio of the first run to the second.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # peer_train, speculators_peer
import peer_train  # noqa: E402

# ----------------------------------------------------------------------------- replay


class SpeculatorsHead:
    """A speculators Eagle3DraftModel behind eagle3's head interface (forward on our aligned
    packed rows, target_logits), for head_replay.train_side_figures. At our position t it gets what its
    shift_batch would give it (input x_{t+1}, aux g_t, position + 1), so its step logits at t are
    ours at t (eagle3/draft/head.py); positions whose chain runs past a sample's end read other
    tokens in the two models, and are never counted."""

    def __init__(self, model):
        self.model = model

    def to(self, device):
        self.model.to(device)
        return self

    def __call__(self, aux_hidden, input_ids, position_ids, segment_ids, ttt_steps: int) -> list[torch.Tensor]:
        from eagle3.draft.shift import shift_left

        ids, _ = shift_left(input_ids, segment_ids, 1, fill=0)
        logits: list[torch.Tensor] = []
        hook = self.model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o.float()))
        try:
            with torch.compiler.set_stance("force_eager"):  # its forward is compiled on CUDA
                self.model(
                    hidden_states=aux_hidden.to(self.model.fc.weight.dtype),
                    input_ids=ids,
                    document_ids=segment_ids,
                    position_ids=position_ids + 1,
                    ttt_steps=ttt_steps,
                )
        finally:
            hook.remove()
        return logits

    def target_logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        norm = self.model.verifier_norm
        return self.model.verifier_lm_head(norm(final_hidden.to(norm.weight.dtype))).float()

    def teacher_logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
        """head_replay's teacher: speculators trains from the final state, so its batches hold it
        (no top-k teacher); every row usable."""
        if "final_hidden" not in batch:
            raise ValueError(f"SpeculatorsHead: expected a batch with final_hidden, got keys {sorted(batch)}")
        return self.target_logits(batch["final_hidden"]), None


def eagle3_lacks(cfg: dict, *, sliding: bool = True) -> list[str]:
    """What this export's config asks for that eagle3's head does not compute: norm options it
    has no field for (eagle3.draft.config.NORM_OPTIONS, where defined) and, with `sliding`,
    sliding-window attention (no effect on samples shorter than the window)."""
    import eagle3.draft.config as draft_config

    known = set(getattr(draft_config, "NORM_OPTIONS", ("norm_before_fc",)))
    lacks = [
        k for k in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual") if cfg.get(k) and k not in known
    ]
    if sliding and (cfg.get("transformer_layer_config") or {}).get("use_sliding_window"):
        lacks.append("sliding_window")
    return lacks


def replay(
    export_dir: str | Path,
    dataset_dir: str,
    *,
    target: str | None = None,
    impl: str = "auto",
    num_draft_tokens: int = 3,
    max_answer_tokens: int | None = 128,
    device: str | None = None,
) -> dict:
    from eagle3.evaluation.diagnostics.head_replay import load_exported_head, train_side_figures
    from eagle3.evaluation.export_info import read_export

    cfg = json.loads((Path(export_dir) / "config.json").read_text())
    # an export names its target as the serving machine knows it (a hub id); read_export finds
    # the local copy the run recorded (summary.json), as evaluate does
    target = target or read_export(export_dir).target
    if impl == "auto":
        impl = "speculators" if eagle3_lacks(cfg) else "eagle3"
    if impl == "eagle3":
        head, _ = load_exported_head(export_dir, target)
    else:
        peer_train.import_speculators()
        head = SpeculatorsHead(peer_train.load_peer_export(export_dir, target))
    figures = train_side_figures(
        head,
        dataset_dir,
        num_draft_tokens=num_draft_tokens,
        max_answer_tokens=max_answer_tokens,
        split="val",
        device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
    )
    return {**figures, "impl": impl, "num_draft_tokens": num_draft_tokens, "max_answer_tokens": max_answer_tokens}


# ----------------------------------------------------------------------------- tokens of a train.py run


def ours_tokens(run_dir: str | Path) -> dict:
    """Tokens a train.py run trained on: its first global_step x accumulation batches of the packed
    stream (every rank's), as its datamodule built them (settings from <run>/.hydra/config.yaml)."""
    from omegaconf import OmegaConf

    from eagle3.store.batch_options import BatchShape
    from eagle3.store.packing import PackedBatchSampler
    from eagle3.training.datamodule import Eagle3DataModule
    from eagle3.training.step_path import resolve_step_path

    run_dir = Path(run_dir)
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    summary = json.loads((run_dir / "summary.json").read_text())
    tc = cfg.train
    # attention=auto -> flex on CUDA: one row per batch, as train.py's step path decides
    path = resolve_step_path(tc, cfg.topology)
    dm = Eagle3DataModule(
        summary["dataset_dir"],
        shape=BatchShape(int(tc.max_tokens_per_batch), path.row_tokens),
        seed=int(tc.seed),
    )
    world = int(cfg.topology.devices) * int(cfg.topology.num_nodes)
    batches = int(summary["global_step"]) * int(tc.accumulate_grad_batches)
    lengths = dm.dataset.lengths
    tokens = 0
    for rank in range(world):
        sampler = PackedBatchSampler(dm.train_batches, shuffle=True, seed=int(tc.seed), rank=rank, world_size=world)
        if sampler.per_pass == 0:
            raise ValueError(f"{run_dir}: no training batches")
        taken = 0
        while taken < batches:
            for b in sampler:  # one pass per iteration, as the loader sees it
                if taken == batches:
                    break
                tokens += sum(min(int(lengths[dm.train_idx[i]]), int(tc.max_tokens_per_batch)) for i in b)
                taken += 1
    return {
        "tokens": tokens,
        "global_step": int(summary["global_step"]),
        "world_size": world,
        "max_tokens_per_batch": int(tc.max_tokens_per_batch),
        "attention": path.attention.value,
    }


# ----------------------------------------------------------------------------- table


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def run_facts(name: str, run: Path) -> dict:
    """Steps and tokens trained: peer_train.json (peer) or summary.json + tokens.json (train.py)."""
    peer = _read(run / "peer_train.json")
    if peer is not None:
        return {"steps": peer["global_step"], "tokens": peer["tokens"], "minutes": peer["minutes"]}
    summary = _read(run / "summary.json")
    if summary is None:
        raise SystemExit(f"--run {name}={run}: neither peer_train.json nor summary.json there")
    tokens = _read(run / "tokens.json") or {}
    return {"steps": summary["global_step"], "tokens": tokens.get("tokens"), "minutes": None}


def acceptance(run: Path, args) -> dict:
    """vLLM's figures for the run's export: <run>/acceptance/acceptance.json, measured now if absent."""
    out = run / "acceptance"
    if args.rerun or not (out / "acceptance.json").is_file():
        cmd = [
            sys.executable,
            str(ROOT / "evaluate.py"),
            f"export_dir={run / 'export'}",
            f"out_dir={out}",
            f"dataset_dir={args.dataset_dir}",
            f"eval.max_prompts={args.max_prompts}",
            f"eval.humaneval_prompts={args.humaneval_prompts}",
            f"eval.max_new_tokens={args.max_new_tokens}",
            f"eval.num_draft_tokens={args.num_draft_tokens}",
            f"baseline={str(args.baseline).lower()}",
        ]
        cmd += [f"target={args.target}"] if args.target else []
        print("+ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return json.loads((out / "acceptance.json").read_text())


def replay_of(run: Path, args) -> dict | None:
    """<run>/replay.json (written on the GPU), or computed here when the dataset's shards are."""
    from eagle3.store import shards_on_disk

    found = _read(run / "replay.json")
    if found is None and shards_on_disk(args.dataset_dir):
        found = replay(
            run / "export",
            args.dataset_dir,
            target=args.target,
            num_draft_tokens=args.num_draft_tokens,
            max_answer_tokens=args.max_new_tokens,
        )
        (run / "replay.json").write_text(json.dumps(found, indent=1))
    return found


def row(name: str, run: Path, args) -> dict:
    acc = acceptance(run, args)
    rep = replay_of(run, args) or {}
    # evaluate's own replays (acceptance.json) run eagle3's head; prompts are shorter than a window
    lacks = eagle3_lacks(json.loads((run / "export" / "config.json").read_text()), sliding=False)
    return {
        "run": name,
        "dir": str(run),
        **run_facts(name, run),
        "val_replay": rep.get("replay_accept_len"),
        "replay_impl": rep.get("impl"),
        "vllm_mean_acceptance_length": acc["mean_acceptance_length"],
        "vllm_per_position": acc["per_position_acceptance_rate"],
        "prompts": acc["prompts"],
        "by_source": {s: f["mean_acceptance_length"] for s, f in acc["by_source"].items()},
        "evaluate_replays_invalid": lacks,
    }


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, list):
        return " / ".join(_fmt(v, digits) for v in x)
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def ratio(a: dict, b: dict) -> dict:
    def r(x, y):
        if isinstance(x, list) and isinstance(y, list):
            return [u / v if v else None for u, v in zip(x, y)]
        return x / y if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else None

    keys = ("tokens", "steps", "val_replay", "vllm_mean_acceptance_length", "vllm_per_position")
    return {"run": f"{a['run']}/{b['run']}", **{k: r(a[k], b[k]) for k in keys}}


def markdown(rows: list[dict], ratios: dict | None, args) -> str:
    lines = [
        f"K = {args.num_draft_tokens} draft tokens, greedy, answers <= {args.max_new_tokens} tokens; "
        f"prompts: {rows[0]['prompts']} (the same for every run)",
        "",
        "| run | tokens trained | optimizer steps | val replay | vLLM mean acceptance length | "
        "per-position acceptance | by source |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        src = ", ".join(f"{s} {v:.3f}" for s, v in r["by_source"].items())
        lines.append(
            f"| {r['run']} | {_fmt(r['tokens'])} | {_fmt(r['steps'])} | {_fmt(r['val_replay'])} | "
            f"{_fmt(r['vllm_mean_acceptance_length'])} | {_fmt(r['vllm_per_position'])} | {src} |"
        )
    if ratios:
        f2 = {k: _fmt(v, 2) for k, v in ratios.items()}
        lines.append(
            f"| {ratios['run']} | {f2['tokens']} | {f2['steps']} | {f2['val_replay']} | "
            f"{f2['vllm_mean_acceptance_length']} | {f2['vllm_per_position']} | |"
        )
    lines += [
        "",
        "val replay: the validation split replayed as serving drafts (replay.json; "
        + ", ".join(f"{r['run']}: {r['replay_impl'] or '-'}" for r in rows)
        + ").",
    ]
    lines += [
        f"{r['run']}: eagle3's head lacks {', '.join(r['evaluate_replays_invalid'])}, so the train-side and "
        "served replays in its acceptance.json do not describe it"
        for r in rows
        if r["evaluate_replays_invalid"]
    ]
    return "\n".join(lines)


def table(args) -> dict:
    runs = []
    for spec in args.run:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--run {spec!r}: expected NAME=DIR")
        runs.append((name, Path(path)))
    rows = [row(name, run, args) for name, run in runs]
    ratios = ratio(rows[0], rows[1]) if len(rows) >= 2 else None
    text = markdown(rows, ratios, args)
    out = Path(args.out_dir or runs[0][1].parent)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peer_quality.md").write_text(text + "\n")
    doc = {
        "rows": rows,
        "ratio": ratios,
        "settings": {
            k: getattr(args, k)
            for k in (
                "dataset_dir",
                "verifier",
                "num_draft_tokens",
                "max_prompts",
                "humaneval_prompts",
                "max_new_tokens",
            )
        },
    }
    (out / "peer_quality.json").write_text(json.dumps(doc, indent=1))
    print(text)
    print(str(out / "peer_quality.md"))
    return doc


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train-peer"]:  # bench/peer_train.py's own options
        peer_train.main(argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("train-peer", help="bench/peer_train.py (see its --help)")
    rp = sub.add_parser("replay", help="val-split replay of an export (needs the dataset's shards)")
    rp.add_argument("--export-dir", required=True)
    rp.add_argument("--dataset-dir", required=True)
    rp.add_argument("--target", default=None, help="target dir (default: the export's)")
    rp.add_argument("--impl", choices=("auto", "eagle3", "speculators"), default="auto")
    rp.add_argument("--num-draft-tokens", type=int, default=3)
    rp.add_argument("--max-answer-tokens", type=int, default=128, help="0: whole answers")
    rp.add_argument("--out", required=True)
    tk = sub.add_parser("tokens", help="tokens a train.py run trained on (needs the dataset's shards)")
    tk.add_argument("--run-dir", required=True)
    tk.add_argument("--out", required=True)
    tb = sub.add_parser("table", help="measure the runs in vLLM here and print the side-by-side table")
    tb.add_argument("--run", action="append", required=True, help="NAME=DIR, first the one ratios are taken of")
    tb.add_argument("--dataset-dir", required=True, help="the dataset (its manifest.json at least: the val prompts)")
    tb.add_argument("--target", default=None, help="target dir here (default: each export's)")
    tb.add_argument("--num-draft-tokens", type=int, default=3)
    tb.add_argument("--max-prompts", type=int, default=48)
    tb.add_argument("--humaneval-prompts", type=int, default=24)
    tb.add_argument("--max-new-tokens", type=int, default=128)
    tb.add_argument("--baseline", action="store_true", help="also run the target alone (tokens/s, greedy check)")
    tb.add_argument("--rerun", action="store_true", help="measure again even where acceptance.json exists")
    tb.add_argument("--out-dir", default=None, help="where the table goes (default: the first run's parent)")
    args = ap.parse_args(argv)
    if args.cmd == "replay":
        doc = replay(
            args.export_dir,
            args.dataset_dir,
            target=args.target,
            impl=args.impl,
            num_draft_tokens=args.num_draft_tokens,
            max_answer_tokens=args.max_answer_tokens or None,
        )
    elif args.cmd == "tokens":
        doc = ours_tokens(args.run_dir)
    else:
        table(args)
        return
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in doc.items() if not isinstance(v, list)}))


if __name__ == "__main__":
    main()
