"""Online vs offline hidden states on one device: training tokens/s when the frozen target runs
inside the training process (train.hidden_states=online) against training from a stored
dataset (offline), plus the extraction the offline route needs first, and peak GPU memory.

Real eagle3 code throughout: the transformers capture backend and typed adapter, the shard
writer, the Lightning module and data module, the compiled flex step of the GPU default. The
target has a preset's shapes and random weights (speed does not depend on the values); the
samples are random token ids with ShareGPT-like lengths.

    python bench/online_throughput.py --preset llama3-8b --steps 40 --out online.json   # H200
    python bench/online_throughput.py --preset tiny --steps 6 --warmup 2                 # CPU smoke

Reported: tokens/s of each route after warm-up, the extraction's tokens/s (capture + shard
writes), the wall time of one and of three epochs over the same data by each route (extract
once + train k epochs, against k online epochs) from those measured rates, and the number of
epochs from which offline is faster.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from harness import target_config, write_json  # beside this file; puts the checkout on sys.path
from step_profile import StepProfile  # beside this file

from eagle3.config.training import TrainConfig
from eagle3.data.vocab import build_draft_vocab
from eagle3.draft.config import DraftConfig
from eagle3.draft.head import Eagle3DraftHead
from eagle3.store import ShardWriter, write_token_dataset
from eagle3.store.batch_options import BatchShape
from eagle3.store.vocab_files import DraftVocabs
from eagle3.store.write_options import WriteOptions
from eagle3.target_model.capture_hf import HFCaptureBackend
from eagle3.target_model.layer_ids import aux_and_final, default_aux_ids
from eagle3.training.callbacks import TokenThroughput
from eagle3.training.datamodule import Eagle3DataModule
from eagle3.training.module import Eagle3LitModule
from eagle3.training.online import OnlineHiddenStates

SHAPES = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
PRESETS = {
    # Llama-3.1-8B: its shapes from conf/model/llama3_1_8b.yaml
    "llama3-8b": dict(
        **{k: v for k, v in target_config("llama3_1_8b").items() if k in SHAPES},
        tokens_per_batch=8192,
        lengths=(256, 2048),
        draft_vocab=32000,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=2048,
        tokens_per_batch=512,
        lengths=(32, 200),
        draft_vocab=512,
    ),
}


def target_model(p: dict, device: str) -> tuple[torch.nn.Module, dict]:
    from transformers import LlamaConfig, LlamaModel

    hf = dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=p["hidden_size"],
        num_hidden_layers=p["num_hidden_layers"],
        num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"],
        intermediate_size=p["intermediate_size"],
        vocab_size=p["vocab_size"],
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the device: no fp32 copy of 8B weights
    try:
        with torch.device(device):
            model = LlamaModel(LlamaConfig(**hf)).eval()
    finally:
        torch.set_default_dtype(default)
    return model, hf


def samples(p: dict, total_tokens: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    lo, hi = p["lengths"]
    out, n = [], 0
    while n < total_tokens:
        t = int(torch.randint(lo, hi + 1, (1,), generator=g))
        ids = torch.randint(0, p["vocab_size"], (t,), generator=g)
        mask = torch.zeros(t, dtype=torch.bool)
        mask[t // 3 :] = True  # the answer part
        out.append((f"s{len(out):06d}", ids, mask))
        n += t
    return out


def head_for(hf: dict, p: dict, target: torch.nn.Module, d2t, t2d) -> Eagle3DraftHead:
    torch.manual_seed(1)
    cfg = DraftConfig.from_target_config(
        hf, draft_vocab_size=p["draft_vocab"], norm_before_fc=True, norm_before_residual=True, norm_output=True
    )
    head = Eagle3DraftHead(cfg, attention="flex" if torch.cuda.is_available() else "sdpa")
    embed = target.embed_tokens.weight.detach().float().cpu()
    lm_head = torch.randn(p["vocab_size"], p["hidden_size"], generator=torch.Generator().manual_seed(2)) * 0.02
    head.load_target_weights(embed, target.norm.weight.detach().float().cpu(), lm_head, d2t, t2d, True)
    return head


class StepClock(L.Callback):
    """Tokens (real, not padding) and host time at the end of every optimizer step. The device
    is synchronised only at the end of the warm-up and of the run (``sync_at``): a wait after
    every step would keep the next batch's copy from overlapping the step, as train.py does not
    wait either; the rate between the two synchronised points is exact."""

    def __init__(self, sync_at: tuple[int, int]):
        self.sync_at = sync_at  # (the warm-up's last step, the run's last step), 0-based
        self.times, self.tokens, self.graphs = [], [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from torch._dynamo.utils import counters

        if torch.cuda.is_available() and len(self.times) in self.sync_at:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        self.tokens.append(int(batch["num_tokens"]))  # counted on the host by the collate
        self.graphs.append(int(counters["stats"]["unique_graphs"]))  # dynamo's graphs so far

    def rate(self, warmup: int) -> float:
        t = self.times[warmup:]
        return sum(self.tokens[warmup + 1 :]) / (t[-1] - t[0])


def train(
    dataset_dir: Path,
    head,
    p: dict,
    steps: int,
    warmup: int,
    online: OnlineHiddenStates | None,
    workers: int = 0,
    profile: Path | None = None,
) -> dict:
    cuda = torch.cuda.is_available()
    # the rest as the schema's defaults: forward KL, step decay 0.8, AdamW (0.9, 0.95), no time budget
    tc = TrainConfig(ttt_steps=3, compile=cuda, lr=1e-3, warmup_steps=10, max_steps=steps)
    dm = Eagle3DataModule(
        str(dataset_dir),
        shape=BatchShape(p["tokens_per_batch"], fixed_shape=cuda),
        online=online,
        num_workers=workers,
        pin_memory=cuda,
    )
    module = Eagle3LitModule(head, tc, replay_draft_tokens=0)
    clock = StepClock((warmup, steps - 1))
    throughput = TokenThroughput()  # what train.py logs as train/tokens_per_s
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        precision="bf16-mixed" if cuda else "32-true",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        callbacks=[clock, throughput] + ([StepProfile(warmup, 5, profile)] if profile else []),
        use_distributed_sampler=False,
    )
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    return {
        "tokens_per_s": clock.rate(warmup),
        "steps": len(clock.times),
        "logged_tokens_per_s": float(trainer.callback_metrics.get("train/tokens_per_s", float("nan"))),
        "logged_data_wait_frac": float(trainer.callback_metrics.get("train/data_wait_frac", float("nan"))),
        # graphs compiled after the warm-up steps: a recompile (a new shape or a failed guard) if > 0
        "recompiles_after_warmup": clock.graphs[-1] - clock.graphs[warmup],
        "wall_s": time.perf_counter() - t0,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def extract(dataset_dir: Path, model, hf: dict, p: dict, data, vocab, device: str, layer_ids: list[int]) -> dict:
    """The offline route's first stage: capture every sample and write the shards."""
    t0 = time.perf_counter()
    backend = HFCaptureBackend("random", layer_ids, dtype=torch.bfloat16, device=device, model=model)
    writer = ShardWriter(
        dataset_dir,
        layer_ids=layer_ids,
        hidden_size=hf["hidden_size"],
        dtype=torch.bfloat16,
        fingerprint_inputs={"bench": "online_throughput", "preset": hf},
        write=WriteOptions(background=True, writer_threads=2),
    )
    try:
        for sample_id, record in backend.capture_with_ids(data):
            writer.add(sample_id, record)
        freq, (d2t, t2d) = vocab
        writer.finish(freq, {p["draft_vocab"]: (d2t, t2d)}, val_ids=[])
    finally:
        writer.close()
    secs = time.perf_counter() - t0
    tokens = sum(int(s[1].numel()) for s in data)
    size = sum(f.stat().st_size for f in dataset_dir.glob("shard-*"))
    return {"tokens_per_s": tokens / secs, "wall_s": secs, "tokens": tokens, "bytes": size, "layer_ids": layer_ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per route (one epoch of the data)")
    ap.add_argument("--warmup", type=int, default=8, help="steps left out of the rates (compiles)")
    ap.add_argument(
        "--workers", type=int, nargs="+", default=[0], help="offline: DataLoader workers (train.num_workers), each run"
    )
    ap.add_argument("--skip-online", action="store_true", help="only the offline route (extract, then train)")
    ap.add_argument("--dir", default=None, help="where the datasets go (default: a temp dir)")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--profile", default=None, help="file: host ops, kernels and blocking calls of 5 offline steps after warm-up"
    )
    args = ap.parse_args()
    p = PRESETS[args.preset]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, hf = target_model(p, device)
    data = samples(p, int(args.steps * p["tokens_per_batch"] * 0.97))  # ~steps batches once packed
    freq = torch.zeros(p["vocab_size"], dtype=torch.int64)
    for _, ids, mask in data:
        freq += torch.bincount(ids[mask], minlength=p["vocab_size"])
    vocab = (freq, build_draft_vocab(freq, p["draft_vocab"]))
    root = Path(args.dir or tempfile.mkdtemp(prefix="online_bench_"))
    n = hf["num_hidden_layers"]
    layer_ids = aux_and_final(default_aux_ids(n), n)  # EAGLE-3's default aux layers + the final state
    tokens_dir = root / "tokens"
    write_token_dataset(
        tokens_dir,
        data,
        val_ids=[],
        fingerprint_inputs={"bench": "online_throughput", "preset": hf},
        layer_ids=layer_ids,
        hidden_size=hf["hidden_size"],
        dtype=torch.bfloat16,
        vocab=DraftVocabs(freq, {p["draft_vocab"]: vocab[1]}),
    )
    d2t, t2d = vocab[1]
    online = OnlineHiddenStates(
        "random",
        layer_ids,
        hf["hidden_size"],
        torch.bfloat16,
        max_tokens_per_batch=p["tokens_per_batch"],
        row_tokens=None,
        fixed_shape=device == "cuda",
        model=model,
    )
    result = {"preset": args.preset, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    # the same initial head for every run
    heads = [head_for(hf, p, model, d2t, t2d) for _ in range(1 + len(args.workers))]
    if not args.skip_online:
        result["online"] = train(tokens_dir, heads[0], p, args.steps, args.warmup, online)
        print("online", json.dumps(result["online"]), flush=True)
    result["extract"] = extract(root / "stored", model, hf, p, data, vocab, device, layer_ids)
    print("extract", json.dumps(result["extract"]), flush=True)
    online.close()  # offline training holds no target: its peak memory is the head's alone
    del model
    gc.collect()  # the online run's trainer and data module hold the target in reference cycles
    if device == "cuda":
        torch.cuda.empty_cache()
    runs = {}
    for n, head in zip(args.workers, heads[1:]):
        prof = Path(args.profile) if args.profile and not runs else None  # the first offline run
        runs[n] = train(root / "stored", head, p, args.steps, args.warmup, None, n, prof)
        print(f"offline num_workers={n}", json.dumps(runs[n]), flush=True)
    result["offline_by_workers"] = {str(n): r for n, r in runs.items()}
    result["offline"] = max(runs.values(), key=lambda r: r["tokens_per_s"])
    write_json(args.out, result, indent=1, echo=True)
    if args.skip_online:
        return
    tokens = result["extract"]["tokens"]
    on, off, ext = result["online"]["tokens_per_s"], result["offline"]["tokens_per_s"], result["extract"]["wall_s"]
    result["epochs"] = {
        str(k): {"online_s": k * tokens / on, "extract_then_train_s": ext + k * tokens / off} for k in (1, 3)
    }
    # k * D / on  >  E + k * D / off   <=>   k > E / (D / on - D / off)
    gain = tokens / on - tokens / off
    result["offline_wins_from_epochs"] = math.ceil(ext / gain + 1e-9) if gain > 0 else None
    write_json(args.out, result, indent=1, echo=True)


if __name__ == "__main__":
    main()
