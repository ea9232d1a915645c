"""The peer side of bench/peer_quality.py: speculators 0.9's EAGLE-3 draft (Eagle3DraftModel and
its KL loss) trained on one of our extracted datasets for a wall-clock budget, then saved with
speculators' own save_pretrained.

    python bench/peer_train.py --dataset-dir data/<fingerprint> --minutes 6 --out outputs/peer
    python bench/peer_train.py --dataset-dir <dir> --max-steps 20 --seq-len 1024 --out /tmp/peer   # smoke

Recipe: what `speculators train` runs by default, read from its TrainConfig at run time (ttt 3,
lr 1e-3, weight decay 0.01, KL loss, the EAGLE-3.1 norms norm_before_fc + norm_before_residual +
norm_output, one draft layer of the target's MLP width, sliding-window attention of 2048, one
packed row of 8192 tokens per step padded to that length, bf16 autocast over fp32 weights,
grad-norm clip 1.0, embeddings and lm_head frozen as the target's). Two departures, so that both
sides run the same kind of schedule under a time budget: AdamW (its CLI default is Muon:
`--optimizer muon` runs that) and a warm-up + cosine schedule fitted to --minutes
(eagle3.training.schedule.BudgetedCosine, floor 0, warm-up 1% of the steps that fit) instead of
its linear decay over epochs.

Data: our dataset through Eagle3DataModule (same training split, same packer as train.py). Each
sample is fed as speculators' `shift_batch` feeds one (input ids x[1:], aux states g[:-1],
target states z[1:], positions 1..T-1), with the loss mask of the token each position predicts
(tests/unit/draft/test_draft_parity.py): both sides supervise the same tokens.

Output: <out>/export (config.json + model.safetensors in bf16; embed_tokens, the target's frozen
copy, left out unless --keep-embed: vLLM then shares the target's) and <out>/peer_train.json
(steps, tokens, losses, learning rates, the recipe that ran).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # speculators_peer, beside this file
from speculators_peer import import_speculators  # noqa: E402

from eagle3.store import HiddenStateDataset  # noqa: E402
from eagle3.store.batch_options import BatchShape  # noqa: E402
from eagle3.store.packing import PackedBatchSampler, collate_packed  # noqa: E402
from eagle3.target_model.resolve import load_target_head_weights  # noqa: E402
from eagle3.training.builder import draft_vocab  # noqa: E402
from eagle3.training.datamodule import Eagle3DataModule  # noqa: E402
from eagle3.training.schedule import BudgetedCosine  # noqa: E402

# warm-up ramp assumed until the step time is measured (BudgetedCosine's timing warm-up):
# speculators' 1% of a 10k-step run
PROVISIONAL_WARMUP = 100


def recipe_defaults() -> dict:
    """`speculators train`'s defaults for an eagle3 draft, flat (its TrainConfig.flatten())."""
    from speculators.train.config import TrainConfig

    return TrainConfig().flatten()


def target_of(dataset: HiddenStateDataset, cache_dir: str) -> str:
    """The target the dataset was extracted from, materialised under <cache_dir>/targets."""
    m = dataset.manifest
    # provenance.target_dir: where extraction read the target (first-scheme datasets: model.dir)
    read = m.provenance.get("target_dir")
    name = Path(read).name if read else m.fingerprint_inputs["model"]["dir"]
    path = Path(cache_dir).resolve() / "targets" / name
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"{path}: no target here (the directory extraction read: {read or name}); pass --target or --cache-dir"
        )
    return str(path)


def load_frozen_parts(model, target: str, *, init_lm_head: bool) -> None:
    """The target's pieces a speculators draft holds, as its load_verifier_weights copies them:
    embeddings, the draft-vocab rows of lm_head (verifier_lm_head, and lm_head at init), the
    final norm. All frozen (speculators 0.9 trains with lm_head frozen)."""
    w = load_target_head_weights(target)
    rows = w["lm_head"][model.t2d.cpu()] if model.use_draft_vocab else w["lm_head"]
    pieces = [(model.embed_tokens, w["embed"]), (model.verifier_lm_head, rows), (model.verifier_norm, w["norm"])]
    if init_lm_head:
        pieces.append((model.lm_head, rows))
    with torch.no_grad():
        for module, weight in pieces:
            module.weight.copy_(weight)
    for module in (model.embed_tokens, model.lm_head, model.verifier_lm_head, model.verifier_norm):
        module.weight.requires_grad_(False)


def build_peer(dataset: HiddenStateDataset, target: str, r: dict, attn: str):
    """Eagle3DraftModel as speculators' CLI builds it (create_transformer_layer_config +
    from_training_args), with our dataset's aux layer ids and draft vocabulary."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.cli import create_transformer_layer_config

    tl = create_transformer_layer_config(
        target,
        r["num_layers"],
        r["draft_arch"],
        r["draft_hidden_act"],
        r["sliding_window"],
        r["full_attention_indices"],
        r["draft_mrope_full_head_hack"],
    )
    tl._attn_implementation = attn
    d2t, t2d = draft_vocab(dataset, min(int(r["draft_vocab_size"]), int(tl.vocab_size)))
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tl,
        draft_vocab_size=int(d2t.shape[0]),
        norm_before_residual=r["norm_before_residual"],
        norm_before_fc=r["norm_before_fc"],
        fc_norm=r["fc_norm"],
        norm_output=r["norm_output"],
        embed_requires_grad=r["embed_requires_grad"],
        eagle_aux_hidden_state_layer_ids=list(dataset.layer_ids[:-1]),  # the last id is the final state
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=int(r["ttt_steps"]))],
            verifier=VerifierConfig.from_pretrained(target),
        ),
    )
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(t2d, d2t)
    load_frozen_parts(model, target, init_lm_head=True)
    return model


def load_peer_export(export_dir: str | Path, target: str, attn: str = "sdpa"):
    """A saved peer draft (speculators' from_pretrained), frozen parts from the target, fp32."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(export_dir))
    config.transformer_layer_config._attn_implementation = attn
    config.speculators_config.verifier.name_or_path = str(target)  # the path it was trained with may not exist here
    model = Eagle3DraftModel.from_pretrained(str(export_dir), config=config)
    load_frozen_parts(model, target, init_lm_head=False)
    return model.float().eval()


def save_peer(model, out: Path, keep_embed: bool) -> None:
    """speculators' checkpointer save: bf16 state dict through save_pretrained, dtype patched."""
    from speculators.train.checkpointer import convert_float_dtype, patch_config_dtype

    state = {k: v for k, v in model.state_dict().items() if keep_embed or not k.startswith("embed_tokens.")}
    model.save_pretrained(out, state_dict=convert_float_dtype(state, torch.bfloat16))
    patch_config_dtype(out / "config.json", torch.bfloat16)


def shift_sample(item: dict) -> dict:
    """Our aligned sample (x_t, g_t, z_t, mask of x_t) as speculators' shift_batch feeds it:
    x[1:], g[:-1], z[1:], and at i the mask of x_{i+2}, the token the step-0 draft at i predicts."""
    h, mask = item["hidden"], item["loss_mask"]
    aux = h.shape[1] - 1
    return {
        "input_ids": item["input_ids"][1:],
        "loss_mask": torch.cat([mask[2:], mask.new_zeros(1)]),
        "hidden": torch.cat([h[:-1, :aux], h[1:, aux:]], dim=1),
    }


def collate(items: list[dict], seq_len: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One packed row padded to seq_len (document -1, position 0, as speculators' CollateFn),
    as Eagle3DraftModel.forward's keyword arguments."""
    b = collate_packed([shift_sample(i) for i in items], seq_len, pad_to=seq_len)
    seg = b["segment_ids"]
    return {
        "hidden_states": b["aux_hidden"].to(dtype),
        "input_ids": b["input_ids"],
        "document_ids": seg,
        "loss_mask": b["loss_mask"],
        "position_ids": torch.where(seg >= 0, b["position_ids"] + 1, 0),
        "verifier_last_hidden_states": b["final_hidden"].to(dtype),
    }


def pick_loss_impl(device: torch.device) -> tuple[str, str]:
    """(implementation, why): speculators' fused Triton KL where it imports, runs under
    torch.compile (its model's forward is compiled on CUDA, loss included) and agrees with the
    eager one on this GPU; the eager KL otherwise (always on CPU)."""
    if device.type != "cuda":
        return "eager", "the fused loss is a Triton kernel (GPU only)"
    try:
        from speculators.losses import resolve_loss_config

        fused, eager = (resolve_loss_config("kl_div", impl)["kl_div"][0] for impl in ("fused", "eager"))
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(1, 256, 4096, device=device, generator=g).bfloat16().requires_grad_()
        y = torch.randn(1, 256, 4096, device=device, generator=g).bfloat16()
        got = torch.compile(fused)(x, y)
        got.sum().backward()
        want = eager(x.detach(), y)
        if not torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2):
            return "eager", f"fused loss disagrees with eager (max diff {float((got - want).abs().max()):.3g})"
        return "fused", "fused Triton loss (probed under torch.compile: runs, matches eager)"
    except Exception as e:  # noqa: BLE001 - any failure of the kernel means the eager loss
        return "eager", f"fused loss failed under torch.compile: {type(e).__name__}: {str(e)[:200]}"
    finally:
        torch._dynamo.reset()  # the probe's graphs are not the model's


class FittedCosine(BudgetedCosine):
    """BudgetedCosine whose warm-up is `ratio` of the steps that fit: until those are known
    (the step time is measured after BudgetedCosine's timing warm-up), the ramp assumes
    PROVISIONAL_WARMUP steps."""

    def __init__(self, *, ratio: float, total_steps: int, min_ratio: float, clock):
        super().__init__(warmup=PROVISIONAL_WARMUP, total_steps=total_steps, min_ratio=min_ratio, clock=clock)
        self.ratio, self.resolved = ratio, False

    def __call__(self, step: int) -> float:
        if not self.resolved and step > self.state.last_step:
            left = self.steps_left(step)
            if left is not None:
                # never behind this step: the cosine then starts here, at the peak
                self.warmup, self.resolved = max(step, round(self.ratio * (step + left))), True
        return super().__call__(step)


def endless(loader):
    while True:  # each pass over the loader is the sampler's next pass (a new permutation)
        yield from loader


def train(args) -> dict:
    stood_in = import_speculators()
    r = recipe_defaults()
    r.update(optimizer=args.optimizer, draft_vocab_size=args.draft_vocab, total_seq_len=args.seq_len)
    for flag in ("norm_before_fc", "norm_before_residual", "norm_output"):
        if getattr(args, flag) is not None:
            r[flag] = getattr(args, flag)
    torch.manual_seed(int(r["seed"]))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    attn = r["draft_attn_impl"] if device.type == "cuda" else "sdpa"  # flex has no backward on CPU
    dm = Eagle3DataModule(args.dataset_dir, shape=BatchShape(args.seq_len), seed=int(r["seed"]))
    target = str(Path(args.target).resolve()) if args.target else target_of(dm.dataset, args.cache_dir)
    model = build_peer(dm.dataset, target, r, attn).to(device)
    loss_impl, loss_note = pick_loss_impl(device)
    from speculators.losses import resolve_loss_config
    from speculators.train.optimizers import build_optimizers

    loss_config = resolve_loss_config(r["loss_fn"], loss_impl)
    dtype = getattr(torch, r["hidden_states_dtype"])
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(dm.dataset, dm.train_idx),
        batch_sampler=PackedBatchSampler(dm.train_batches, shuffle=True, seed=int(r["seed"])),
        collate_fn=partial(collate, seq_len=args.seq_len, dtype=dtype),
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        pin_memory=device.type == "cuda",
    )
    optimizers = build_optimizers(model, argparse.Namespace(**r))
    budget = args.minutes * 60.0 if args.minutes else None
    start = time.monotonic()

    def clock() -> tuple[float, float | None]:
        elapsed = time.monotonic() - start
        return elapsed, (budget - elapsed if budget is not None else None)

    schedule = FittedCosine(
        ratio=args.warmup_ratio,
        total_steps=args.max_steps or 0,
        min_ratio=args.min_lr_ratio,
        clock=clock if budget is not None else None,
    )
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: schedule(s)) for o in optimizers]
    call = dict(
        ttt_steps=int(r["ttt_steps"]), ttt_step_loss_decay=float(r["ttt_step_loss_decay"]), loss_config=loss_config
    )
    losses, lrs, tokens, step = [], [], 0, 0
    model.train()
    for batch in endless(loader):  # speculators' trainer step: forward, zero_grad, backward, clip, step
        if (args.max_steps and step >= args.max_steps) or (budget is not None and clock()[0] >= budget):
            break
        tokens += int((batch["document_ids"] >= 0).sum())
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=dtype):
            _, loss, _ = model(**batch, **call)
        for o in optimizers:
            o.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lrs.append(optimizers[0].param_groups[0]["lr"])
        for o in optimizers:
            o.step()
        for s in schedulers:
            s.step()
        losses.append(float(loss.detach()))  # a sync per step, as its trainer logs every step
        step += 1
        if step % args.log_every == 0 or step == 1:
            print(
                f"[{clock()[0]:7.1f}s] step {step} loss {losses[-1]:.4f} lr {lrs[-1]:.3g} tokens {tokens:,}", flush=True
            )
    elapsed = clock()[0]
    out = Path(args.out)
    save_peer(model, out / "export", args.keep_embed)
    tail = max(1, min(10, len(losses) // 4))
    doc = {
        "side": "peer (speculators Eagle3DraftModel)",
        "dataset_dir": str(Path(args.dataset_dir).resolve()),
        "verifier": target,
        "export_dir": str((out / "export").resolve()),
        "device": str(device),
        "attention": attn,
        "loss_impl": loss_impl,
        "loss_note": loss_note,
        "stand_in_modules": stood_in,
        "minutes": args.minutes,
        "max_steps": args.max_steps,
        "elapsed_s": elapsed,
        "global_step": step,
        "tokens": tokens,
        "seq_len": args.seq_len,
        "step_time_s": schedule.state.per_step,
        "warmup_steps": schedule.warmup,
        "lr_peak": float(r["lr"]),
        "lr_floor_ratio": args.min_lr_ratio,
        "lr_last": lrs[-1] if lrs else None,
        "schedule_progress": schedule.state.progress if budget is not None else None,  # time budget only
        "loss_first": sum(losses[:tail]) / tail if losses else None,
        "loss_last": sum(losses[-tail:]) / tail if losses else None,
        "losses": losses,
        "lrs": lrs,
        "recipe": {
            k: r[k]
            for k in (
                "ttt_steps",
                "lr",
                "weight_decay",
                "optimizer",
                "loss_fn",
                "ttt_step_loss_decay",
                "norm_before_fc",
                "norm_before_residual",
                "norm_output",
                "fc_norm",
                "sliding_window",
                "num_layers",
                "draft_vocab_size",
                "total_seq_len",
                "hidden_states_dtype",
                "seed",
            )
        },
        "versions": {"torch": torch.__version__, "speculators": importlib.metadata.version("speculators")},
    }
    (out / "peer_train.json").write_text(json.dumps(doc, indent=1))
    print(f"peer: {step} steps, {tokens:,} tokens in {elapsed:.0f} s, loss {doc['loss_first']} -> {doc['loss_last']}")
    print(str(out / "export"))
    return doc


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset-dir", required=True, help="an extracted dataset (manifest.json + shards)")
    ap.add_argument("--out", required=True, help="run directory: export/ and peer_train.json go here")
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock budget of the training loop")
    ap.add_argument("--max-steps", type=int, default=None, help="step cap (smoke runs); with --minutes, both")
    ap.add_argument("--target", default=None, help="target dir (default: <cache-dir>/targets/<dataset's model>)")
    ap.add_argument("--cache-dir", default=".cache")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--seq-len", type=int, default=8192, help="tokens per packed row (its total_seq_len)")
    ap.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw")
    ap.add_argument("--warmup-ratio", type=float, default=0.01, help="warm-up share of the steps that fit")
    ap.add_argument("--min-lr-ratio", type=float, default=0.0, help="cosine floor (transformers' cosine: 0)")
    for flag in ("norm_before_fc", "norm_before_residual", "norm_output"):
        ap.add_argument(
            f"--{flag.replace('_', '-')}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="override speculators' default (on for eagle3)",
        )
    ap.add_argument("--num-workers", type=int, default=4 if torch.cuda.is_available() else 0)
    ap.add_argument("--device", default=None, help="cuda | cpu (default: cuda when present)")
    ap.add_argument("--keep-embed", action="store_true", help="also save embed_tokens (the target's frozen copy)")
    ap.add_argument("--log-every", type=int, default=50)
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if not args.minutes and not args.max_steps:
        raise SystemExit("give --minutes (the budget) or --max-steps")
    return train(args)


if __name__ == "__main__":
    main()
