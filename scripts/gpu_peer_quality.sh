#!/usr/bin/env bash
# Ours against speculators 0.9 at equal budget on one GPU (bench/peer_quality.py). After
# gpu_quality_run.sh has materialised the target and extracted the dataset (part 0, part 1,
# extract), one call trains both side by side on that dataset, each for MINUTES of wall clock:
# ours = train.py (gpu_quality_run.sh's train stage, train.max_time), the peer =
# bench/peer_train.py (speculators' Eagle3DraftModel, its loss and recipe). Then both are
# replayed on the validation split (needs the shards, so here), ours' tokens are recounted,
# and everything is packed.
#   MINUTES=5 bash scripts/gpu_peer_quality.sh [overrides of ours...]   # carry .whl
#   OURS_B="train.norm_output=true ..." adds a third run beside them: ours with those overrides
#   (an A/B of our options at the same budget, packed as oursb/)
#   bash scripts/gpu_quality_run.sh fetch peerq 4                       # parts this call did not return
# (MINUTES + ~1.5 min of start-up, export and replays must fit the call's 10 minutes; the peer
# cannot resume, so the budget is one call's.) Here:
#   bash scripts/gpu_unpack.sh outputs/peerq <sha256> <parts>     # -> ours/ peer/ dataset/manifest.json
#   python bench/peer_quality.py table --run ours=outputs/peerq/ours --run peer=outputs/peerq/peer \
#       --dataset-dir outputs/peerq/dataset --verifier .cache/targets/smollm2_135m-bf16-98362432
#   (with /tmp/sharegpt.jsonl recreated from .gpu/sharegpt.jsonl.xz: the val prompts are read from it)
set -uo pipefail
MINUTES=${MINUTES:-5}
PKG=/tmp/eagle3_pkgs
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"
# speculators, pydantic and their pure-Python dependencies travel as wheels (bench/README.md)
[ -d $PKG/spec ] || python3 -m pip install -q --no-index --no-deps --target $PKG/spec .whl/*.whl || exit 3
export PYTHONPATH=$PKG/spec:$PKG/site:$PKG:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# the dataset extract wrote (DATASET_DIR when several are there)
DS=${DATASET_DIR:-$(dirname "$(ls -t /tmp/data/*/manifest.json | head -1)")}
[ -f "$DS/manifest.json" ] || { echo "no dataset under /tmp/data: run gpu_quality_run.sh extract first" >&2; exit 3; }
SECS=$(python3 -c "print(round(float('$MINUTES') * 60))")
MAX_TIME=$(printf '00:00:%02d:%02d' $((SECS / 60)) $((SECS % 60)))
nvidia-smi --query-gpu=name,memory.used --format=csv 2>/dev/null || true
echo "dataset $DS, $MINUTES min each ($MAX_TIME)"
RETURN_PARTS=0 RUN_DIR=/tmp/run-ours OUT=$OUTD/ours bash scripts/gpu_quality_run.sh train \
  train.max_time=$MAX_TIME "$@" > "$OUTD/ours.log" 2>&1 &
RUNS="ours peer"
if [ -n "${OURS_B:-}" ]; then
  RUNS="ours oursb peer"
  # word splitting of $OURS_B is wanted: it holds several overrides
  RETURN_PARTS=0 RUN_DIR=/tmp/run-oursb OUT=$OUTD/oursb bash scripts/gpu_quality_run.sh train \
    train.max_time=$MAX_TIME $OURS_B "$@" > "$OUTD/oursb.log" 2>&1 &
fi
python3 bench/peer_quality.py train-peer --dataset-dir "$DS" --cache-dir /tmp/cache --minutes "$MINUTES" \
  --out /tmp/run-peer > "$OUTD/peer.log" 2>&1 &
wait
rm -rf "$OUTD/ours" "$OUTD/oursb"  # empty: ours' own pack stays in /tmp/pack-run-ours
for r in $RUNS; do echo "== $r"; grep -vE "^\s*$|^-rw|^total|^d" "$OUTD/$r.log" | tail -12; done
R=(python3 bench/peer_quality.py replay --dataset-dir "$DS")
"${R[@]}" --export-dir /tmp/run-ours/export --out /tmp/run-ours/replay.json
# the same replay through speculators' model (how the peer is replayed): the two paths must agree
"${R[@]}" --export-dir /tmp/run-ours/export --impl speculators --out /tmp/run-ours/replay_speculators.json
"${R[@]}" --export-dir /tmp/run-peer/export --out /tmp/run-peer/replay.json
python3 bench/peer_quality.py tokens --run-dir /tmp/run-ours --out /tmp/run-ours/tokens.json
if [ -n "${OURS_B:-}" ]; then
  "${R[@]}" --export-dir /tmp/run-oursb/export --out /tmp/run-oursb/replay.json
  python3 bench/peer_quality.py tokens --run-dir /tmp/run-oursb --out /tmp/run-oursb/tokens.json
fi
# One pack for both (layout of gpu_unpack.sh: dataset_manifest.json at the top), cut in 15 MiB
# parts: a call returns at most 8 files and 64 MiB, so RETURN_PARTS (4) come back now, the
# rest with `bash scripts/gpu_quality_run.sh fetch peerq 4` while the machine is warm.
PACK=/tmp/pack-peerq; rm -rf "$PACK" "$PACK".tar*; mkdir -p "$PACK/ours/export" "$PACK/peer/export"
cp /tmp/run-ours/summary.json /tmp/run-ours/replay*.json /tmp/run-ours/tokens.json "$PACK/ours/"
cp /tmp/run-ours/.hydra/config.yaml "$PACK/ours/train_config.yaml"
cp /tmp/run-peer/peer_train.json /tmp/run-peer/replay.json "$PACK/peer/"
if [ -n "${OURS_B:-}" ]; then
  mkdir -p "$PACK/oursb/export"
  cp /tmp/run-oursb/summary.json /tmp/run-oursb/replay.json /tmp/run-oursb/tokens.json "$OUTD/oursb.log" "$PACK/oursb/"
  cp /tmp/run-oursb/.hydra/config.yaml "$PACK/oursb/train_config.yaml"
fi
for r in $RUNS; do cp /tmp/run-$r/export/config.json /tmp/run-$r/export/model.safetensors "$PACK/$r/export/"; done
cp "$DS/manifest.json" "$PACK/dataset_manifest.json"
cp "$OUTD/ours.log" "$OUTD/peer.log" "$PACK/"
tar -C "$PACK" -cf "$PACK.tar" . && split -b 15M -d "$PACK.tar" "$PACK.tar.part"
echo "pack $(basename "$PACK"): $(ls "$PACK".tar.part* | wc -l) parts, sha256 $(sha256sum "$PACK.tar" | cut -d' ' -f1)"
ls "$PACK".tar.part* | head -n "${RETURN_PARTS:-4}" | xargs -r cp -t "$OUTD/"
ls -la "$OUTD"
