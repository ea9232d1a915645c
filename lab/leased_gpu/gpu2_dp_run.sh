#!/usr/bin/env bash
# Issue 8 on one host with 2 GPUs: data-parallel extraction (one process per GPU, then the
# merge) vs a 1-GPU extraction of the same samples, and 2-rank DDP (torchrun) vs 1 GPU with
# the same global batch (accumulate 2). Carry .gpu/site .gpu/tok .gpu/sharegpt.jsonl.xz.
#   bash lab/leased_gpu/gpu2_dp_run.sh            (TOPO1/TOPO2/DEV0/DEV1 let it run on CPU too)
TMPD=${TMPD:-/tmp}  # the rented machine's scratch disk: everything these calls leave lives here
set -euo pipefail
export PYTHONPATH=$PWD/.gpu/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off (device notes)
PY=${PYTHON:-python3}; TORCHRUN=${TORCHRUN:-torchrun}
TOPO1=${TOPO1:-gpu1}; TOPO2=${TOPO2:-gpu2_tp2}; W=${W:-$TMPD/dp}
OUTD=${OUT:-$W/out}; mkdir -p "$OUTD" "$W"
[ -f $W/sharegpt.jsonl ] || xz -dc .gpu/sharegpt.jsonl.xz > $W/sharegpt.jsonl
# a random Llama (SmolLM2's tokenizer) big enough for GPU work to dominate overheads
MODEL=(model=tiny_llama model.name=rand_llama_1b model.num_layers=${LAYERS:-16} model.hidden_size=${HID:-2048}
       model.num_attention_heads=16 model.num_key_value_heads=8 model.intermediate_size=${FFN:-5632}
       model.tokenizer_from=$PWD/.gpu/tok)
C=("${MODEL[@]}" data=jsonl data.path=$W/sharegpt.jsonl data.max_samples=${N:-600} data.max_length=${LEN:-1024}
   data.val_fraction=0.05 paths.cache_dir=$W/cache logger=none eval.enabled=false
   capture.shard_max_tokens=65536 head.draft_vocab_size=8192 train.ttt_steps=3
   train.max_tokens_per_batch=${TOK:-8192} train.max_steps=${STEPS:-60} train.warmup_steps=5
   train.val_check_interval=${STEPS:-60} train.compile=false "$@")
t0=$(date +%s.%N)
$PY extract.py "${C[@]}" topology=$TOPO1 paths.datasets_dir=$W/d1 > $W/x1.log 2>&1
t1=$(date +%s.%N)
CUDA_VISIBLE_DEVICES=${DEV0:-0} $PY extract.py "${C[@]}" topology=$TOPO1 paths.datasets_dir=$W/d2 shard_index=0 num_shards=2 > $W/x2a.log 2>&1 &
CUDA_VISIBLE_DEVICES=${DEV1:-1} $PY extract.py "${C[@]}" topology=$TOPO1 paths.datasets_dir=$W/d2 shard_index=1 num_shards=2 > $W/x2b.log 2>&1 &
wait
t2=$(date +%s.%N)
$PY extract.py "${C[@]}" topology=$TOPO1 paths.datasets_dir=$W/d2 num_shards=2 merge=true > $W/xm.log 2>&1
t3=$(date +%s.%N)
$PY -c "print(f'extract 1 device: {$t1-$t0:.1f} s; 2 devices: {$t2-$t1:.1f} s + merge {$t3-$t2:.1f} s')" | tee $OUTD/timings.txt
$PY - "$W/d1" "$W/d2" <<'PY' | tee $OUTD/compare_extract.txt
import sys, torch
from pathlib import Path
from eagle3.store import HiddenStateDataset
a, b = [HiddenStateDataset(next(p for p in Path(d).iterdir() if p.is_dir() and ".part-" not in p.name), verify="full") for d in sys.argv[1:]]
ia = {a.sample_id(i): i for i in range(len(a))}; ib = {b.sample_id(i): i for i in range(len(b))}
assert ia.keys() == ib.keys(), "sample ids differ"
assert sorted(a.manifest.val_ids) == sorted(b.manifest.val_ids)
worst = 0.0
for sid in ia:
    x, y = a[ia[sid]], b[ib[sid]]
    assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"]), sid
    d = ((x["hidden"].float() - y["hidden"].float()).norm() / x["hidden"].float().norm().clamp_min(1e-6)).item()
    worst = max(worst, d)
print(f"samples {len(ia)} tokens {a.num_tokens} vs {b.num_tokens}; token ids equal; worst relative hidden diff {worst:.2e}")
assert worst < 2e-2
PY
$PY train.py "${C[@]}" topology=$TOPO1 paths.datasets_dir=$W/d1 train.accumulate_grad_batches=2 hydra.run.dir=$W/t1 > $W/t1.log 2>&1
EAGLE3_RUN_ID=ddp2 $TORCHRUN --standalone --nproc_per_node 2 train.py "${C[@]}" topology=$TOPO2 paths.datasets_dir=$W/d1 hydra.run.dir=$W/t2 > $W/t2.log 2>&1
cp $W/t1/summary.json $OUTD/summary_1dev.json; cp $W/t2/summary.json $OUTD/summary_2dev.json
$PY - $W/t1/summary.json $W/t2/summary.json <<'PY' | tee $OUTD/compare_train.txt
import json, sys
one, two = [json.load(open(p)) for p in sys.argv[1:]]
for k in ["val/loss", "val/acc_k0", "val/sim_accept_len", "train/tokens_per_s"]:
    print(f"{k:22s} 1 device {one['final'].get(k, float('nan')):10.4f}   2 devices (DDP) {two['final'].get(k, float('nan')):10.4f}")
print("initial val/loss", one["initial"].get("val/loss"), two["initial"].get("val/loss"))
PY
tail -3 $W/t2.log
