#!/usr/bin/env bash
# A dress rehearsal of the whole GPU pipeline at a real target's shapes, on a rented GPU machine
# that has no registry and no real weights: random weights built there from the model preset
# (model.source=tiny: conf/model/<target>.yaml's facts and extra_config), SmolLM2's tokenizer
# and chat template (its ids fit every vocabulary), the class's experiment recipe. Everything but
# acceptance is real: shapes, memory, disk, throughput, engine start and serving step costs.
#
# Here, once:  bash ../shared/gpu/vllm_cuda_bundle.sh .gpu/vllm     (CUDA vLLM in 6 chunks)
#              python lab/leased_gpu/gpu_bundle.py --max-conversations 4000 (packages, chat data, tokenizer)
# There, call after call, with no pause between calls (/tmp lives only while the machine is warm):
#   bash lab/leased_gpu/gpu_vllm_run.sh carry K         K = 0..5, carrying .gpu/vllm/cK (5 installs vLLM)
#   bash lab/leased_gpu/gpu_rehearsal.sh stage extract  carrying .gpu/site .gpu/tok .gpu/sharegpt.jsonl.xz:
#                                                the random target, extract.py with capture=vllm
#                                                (the target's own answers) and with capture=hf
#   bash lab/leased_gpu/gpu_rehearsal.sh train          train.py for MINUTES (the recipe's head), its export
#   bash lab/leased_gpu/gpu_rehearsal.sh serve          bench/serving_speedup.py: step costs per K and load
#   bash lab/leased_gpu/gpu_rehearsal.sh costs          step costs at the uncut shapes without weights
#                                                (shapes_only.py + bench/serving_speedup.py --load-format
#                                                dummy; SHAPES: overrides, e.g. Kimi's
#                                                "model.extra_config.n_routed_experts=8 topology=gpu1
#                                                model.quantization=null"); resumes a cut-off run
#   bash lab/leased_gpu/gpu_rehearsal.sh clean          the disk for the next target
# TARGET=llama3_1_8b (default) | qwen3_8b | qwen3_30b_a3b (LAYERS cuts it: its 61 GB outgrow a 64 GiB
# disk) | kimi_k2_5 (cut to LAYERS layers and EXPERTS experts to fit one GPU); N conversations
# (default 600); HF_N (150) of them for capture=hf (0: none); TRAIN_ARGS: train's extra overrides. serve and costs: LOADS, DRAFT_TOKENS,
# PROMPTS, NEW_TOKENS, WAVES (waves per load at least, default 2; two waves of ~2 s at load 64 gave
# an MoE target's figure no trust), MAX_MINUTES (no engine starts that would end past it: the
# table holds the K that ran). An engine start at these sizes takes
# 1-2 minutes: five engines (alone, K = 1, 2, 3, 5) outlast one 10-minute call, so run serve and
# costs with DETACH_S (below) or call them again (finished engines are kept in the work dir).
# Each stage writes rehearsal_<stage>.json and its log's tail to $OUT.
TMPD=${TMPD:-/tmp}  # the rented machine's scratch disk: everything these calls leave lives here
set -euo pipefail
PKG=$TMPD/eagle3_pkgs
OUTD=${OUT:-$TMPD/out}; mkdir -p "$OUTD"
TARGET=${TARGET:-llama3_1_8b}
N=${N:-600}
HF_N=${HF_N:-150}
MINUTES=${MINUTES:-3}
W=$TMPD/rehearsal
export PYTHONPATH=$TMPD/vllm_site:$PKG/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# the class's recipe on random weights of the target's shapes
CUT=()
if [ "$TARGET" = kimi_k2_5 ]; then  # one GPU: the first dense layer + MoE layers, fewer experts;
  # its head's checkpoints are 12.7 GiB each: two at once (not three) beside the target and the
  # dataset on a 64 GiB disk
  CUT=(model.num_layers="${LAYERS:-4}" model.extra_config.n_routed_experts="${EXPERTS:-32}"
       model.quantization=null topology=gpu1 callbacks.model_checkpoint.save_last=false)
elif [ "$TARGET" = qwen3_30b_a3b ] && [ -n "${LAYERS:-}" ]; then  # 61 GB of weights outgrow the disk
  CUT=(model.num_layers="$LAYERS")
fi
RECIPE=(experiment="$TARGET" model.source=tiny model.tokenizer_from=$TMPD/tok "${CUT[@]}"
        data=jsonl data.path=$TMPD/sharegpt.jsonl data.max_samples="$N" data.val_fraction=0.05
        paths.cache_dir=$W/cache paths.datasets_dir=$W/data logger=none)
quiet() { grep -vE "Loading weights|it/s\]|s/it\]" | tr '\r' '\n' | grep -vE "it/s\]$|^\s*$" || true; }
gpu_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
now() { date +%s.%N; }

stage_stage() {  # the packages, the tokenizer and the chat data carried in this call
  mkdir -p $PKG $TMPD/tok
  rm -rf $PKG/site && cp -r .gpu/site $PKG/site
  cp .gpu/tok/* $TMPD/tok/
  xz -dc .gpu/sharegpt.jsonl.xz > $TMPD/sharegpt.jsonl
  wc -l $TMPD/sharegpt.jsonl; df -h $TMPD | tail -1; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
}

stage_extract() {
  local t0 t1 t2 t3
  t0=$(now)
  # the random target alone first: its build time is no part of extraction's
  python3 - "${RECIPE[@]}" <<'PY' 2>&1 | quiet | tail -5
import sys, time
from hydra import compose, initialize_config_dir
from pathlib import Path
from eagle3.stages.compose import register_configs
from eagle3.stages.validate import validate_run_config
from eagle3.target_model.resolve import resolve_target
register_configs()
with initialize_config_dir(config_dir=str(Path("conf").resolve()), version_base="1.3"):
    cfg = compose("extract", overrides=sys.argv[1:] + ["paths.output_dir=/tmp/rehearsal/compose"])
t = time.time()
path = resolve_target(cfg.model, cfg.paths.cache_dir)
print(f"target built: {path} in {time.time() - t:.0f} s")
PY
  t1=$(now)
  python3 extract.py "${RECIPE[@]}" capture=vllm 2>&1 | quiet | tee $W/extract_vllm.log | tail -25
  t2=$(now)
  local ds; ds=$(tail -1 $W/extract_vllm.log)
  du -sb "$ds" | tee $W/ds_bytes
  # capture=hf on the first HF_N conversations (their answers come from the regeneration cache)
  [ "$HF_N" -gt 0 ] && python3 extract.py "${RECIPE[@]}" capture=hf data.max_samples="$HF_N" paths.datasets_dir=$W/data_hf \
    2>&1 | quiet | tee $W/extract_hf.log | tail -8 || true
  t3=$(now)
  rm -rf $W/data_hf
  python3 - "$ds" "$t0" "$t1" "$t2" "$t3" > "$OUTD/rehearsal_extract.json" <<'PY'
import json, re, sys
from pathlib import Path
ds, t0, t1, t2, t3 = sys.argv[1], *map(float, sys.argv[2:])
m = json.loads((Path(ds) / "manifest.json").read_text())
def rate(log):
    text = Path(log).read_text() if Path(log).is_file() else ""
    hits = re.findall(r"captured ([\d,]+) tokens in ([\d.]+) s \(([\d,]+) tok/s\)", text)
    return {"tokens": int(hits[-1][0].replace(",", "")), "seconds": float(hits[-1][1]),
            "tok_s": int(hits[-1][2].replace(",", ""))} if hits else None
size = sum(f.stat().st_size for f in Path(ds).glob("shard-*.safetensors"))
counts = m.get("counts") or {k: m[k] for k in ("num_samples", "num_tokens", "num_loss_tokens") if k in m}
print(json.dumps({
    "target_build_s": t1 - t0, "extract_vllm_wall_s": t2 - t1, "extract_hf_wall_s": t3 - t2,
    "capture_vllm": rate("/tmp/rehearsal/extract_vllm.log"), "capture_hf": rate("/tmp/rehearsal/extract_hf.log"),
    "counts": counts, "shard_bytes": size,
    "disk_bytes_per_token": size / max(1, counts.get("tokens", counts.get("num_tokens", 1))),
    "regen_lines": [l for l in Path("/tmp/rehearsal/extract_vllm.log").read_text().splitlines() if "regenerat" in l.lower()][-6:],
    "dataset_dir": ds,
}, indent=1))
PY
  cat "$OUTD/rehearsal_extract.json"
  cp $W/extract_vllm.log "$OUTD/extract_vllm.log"; cp $W/extract_hf.log "$OUTD/extract_hf.log" 2>/dev/null || true
}

stage_train() {
  local t0 t1
  t0=$(now)
  # shellcheck disable=SC2086  # TRAIN_ARGS: extra overrides, e.g. "train.num_workers=0"
  python3 train.py "${RECIPE[@]}" train.max_time="00:00:$(printf %02d "$MINUTES"):00" eval.enabled=false \
    hydra.run.dir=$W/run ${TRAIN_ARGS:-} 2>&1 | quiet | tee $W/train.log | tail -30
  t1=$(now)
  python3 - "$t0" "$t1" > "$OUTD/rehearsal_train.json" <<'PY'
import json, sys
from pathlib import Path
t0, t1 = map(float, sys.argv[1:])
s = json.loads(Path("/tmp/rehearsal/run/summary.json").read_text())
export = Path(s["export_dir"])
keep = {k: v for k, v in s.items() if not isinstance(v, (dict, list)) or k in ("time_budget",)}
keep.update({k: v for k, v in (s.get("final") or {}).items() if k.startswith("train/")})  # tok/s, peak GPU memory
print(json.dumps({"train_wall_s": t1 - t0, "export_bytes": sum(f.stat().st_size for f in export.iterdir()),
                  "export_files": sorted(f.name for f in export.iterdir()), "summary": keep}, indent=1))
PY
  cat "$OUTD/rehearsal_train.json"
  cp $W/train.log "$OUTD/train.log"
}

stage_serve() {
  local target; target=$(python3 -c 'import json; print(json.load(open("/tmp/rehearsal/run/summary.json"))["target_dir"])')
  local ds; ds=$(python3 -c 'import json; print(json.load(open("/tmp/rehearsal/run/summary.json"))["dataset_dir"])')
  python3 bench/serving_speedup.py --export-dir $W/run/export --target "$target" --dataset-dir "$ds" \
    --loads "${LOADS:-1,8,32,64}" --draft-tokens "${DRAFT_TOKENS:-1,2,3,5}" --prompts "${PROMPTS:-32}" \
    --min-waves "${WAVES:-2}" --max-new-tokens "${NEW_TOKENS:-64}" --gpu-memory-utilization 0.85 --max-model-len 2048 \
    ${MAX_MINUTES:+--max-minutes "$MAX_MINUTES"} \
    --out "$OUTD/rehearsal_serving.json" --work-dir $W/serving_work 2>&1 | quiet | tail -40
  grep -hoE "(Model loading took|init engine|Graph capturing finished|Capturing CUDA graphs)[^,]{0,80}" \
    $W/serving_work/engine-k*.log 2>/dev/null | sort | uniq -c | head -20 || true
}

costs_work() { echo "$W/costs_work_$(echo "$TARGET ${SHAPES:-}" | md5sum | cut -c1-8)"; }
stage_costs() {  # step costs at the uncut shapes, no weights: config files only, vLLM dummy weights
  # a work dir per target and SHAPES: finished engines are kept for a resumed call, and must never
  # stand in for another target's
  local cw; cw=$(costs_work)
  rm -rf $W/shapes
  python3 lab/leased_gpu/shapes_only.py $W/shapes experiment="$TARGET" model.tokenizer_from=$TMPD/tok ${SHAPES:-}
  tail -n "${PROMPTS:-32}" $TMPD/sharegpt.jsonl > $W/heldout.jsonl  # the rehearsal trains on the first N
  python3 bench/serving_speedup.py --load-format dummy --export-dir $W/shapes/head --target $W/shapes/target \
    --prompts-jsonl $W/heldout.jsonl --loads "${LOADS:-1,8,32,64}" --draft-tokens "${DRAFT_TOKENS:-1,2,3,5}" \
    --prompts "${PROMPTS:-32}" --min-waves "${WAVES:-2}" --max-new-tokens "${NEW_TOKENS:-64}" \
    --gpu-memory-utilization 0.85 --max-model-len 2048 ${MAX_MINUTES:+--max-minutes "$MAX_MINUTES"} \
    --out "$OUTD/rehearsal_costs.json" --work-dir "$cw" > $W/costs.log 2>&1 || true
  grep -vE "it/s\]|INFO|WARNING" $W/costs.log | tail -30
  engines_back "$cw"
}
# the finished engines' results and keys as one file (a call returns 8 at most): here,
# tar xzf engines_<dir>.tgz -C w && python bench/serving_speedup.py --costs-from w
engines_back() {
  (cd "$1" 2>/dev/null && tar czf "$OUTD/engines_$(basename "$1").tgz" engine-k*.result.json engine-k*.key.json) 2>/dev/null || true
}

stage_clean() {  # the disk for the next target: its weights, datasets and runs go
  rm -rf $W/cache $W/data $W/data_hf $W/run $W/serving_work
  df -h $TMPD | tail -1
}

# DETACH_S=480: a stage runs in the background of the machine (setsid; its output and results kept
# in $W) and the call returns when it ends or after DETACH_S seconds, whichever comes first, so a
# stage longer than one call's limit survives it; `wait_<stage>` in the next call (no pause
# between calls) waits again and brings its results back.
detached() {
  local s=$1
  if [ -f $W/$s.pid ] && kill -0 "$(cat $W/$s.pid)" 2>/dev/null && [ ! -f $W/$s.done ]; then
    echo "$s: already running (pid $(cat $W/$s.pid))"
  else
    rm -f $W/$s.done; mkdir -p $W/out_$s
    # its own session: the end of this call (or its time limit) does not reach it
    OUT=$W/out_$s DETACH_S='' setsid bash -c 'bash "$0" "$1" > "$2" 2>&1; touch "$3"' \
      "$0" "$s" $W/$s.out $W/$s.done < /dev/null > /dev/null 2>&1 &
    echo $! > $W/$s.pid
  fi
  wait_for "$s"
}
wait_for() {
  local s=$1 t0=$SECONDS
  while [ ! -f $W/$s.done ] && [ $((SECONDS - t0)) -lt "${DETACH_S:-480}" ]; do sleep 5; done
  if [ -f $W/$s.done ]; then
    tail -40 $W/$s.out; cp $W/out_$s/* "$OUTD/" 2>/dev/null || true
  else
    # (the costs stage writes its bench output to costs.log)
    grep -hE "engine k[0-9]+: (starting|done)|K=[0-9]+: engine up" $W/$s.out $W/$s.log 2>/dev/null | tail -8 || true
    # the engines that finished come back now: the device time may end before the stage does
    local work=$W/serving_work; [ "$s" = costs ] && work=$(costs_work)
    engines_back "$work"
    echo "$s: still running after $((SECONDS - t0)) s: call again with: bash $0 wait_$s"
  fi
}
stage_wait_serve() { wait_for serve; }
stage_wait_costs() { wait_for costs; }

[ $# -ge 1 ] || { sed -n 2,30p "$0"; exit 2; }
mkdir -p $W
for s in "$@"; do
  if [ -n "${DETACH_S:-}" ] && [[ $s == serve || $s == costs ]]; then detached "$s"; else "stage_$s"; fi
done
