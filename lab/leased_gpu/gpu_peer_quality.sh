#!/usr/bin/env bash
# Ours against speculators 0.9 at equal budget on one GPU (bench/peer_quality.py). After
# gpu_quality_run.sh has materialised the target and extracted the dataset (part 0, part 1,
# extract), one call trains both side by side on that dataset, each for MINUTES of wall clock:
# ours = train.py (gpu_quality_run.sh's train stage, train.max_time), the peer =
# bench/peer_train.py (speculators' Eagle3DraftModel, its loss and recipe). Then both are
# replayed on the validation split (needs the shards, so here), ours' tokens are recounted,
# and everything is packed.
#   MINUTES=5 bash lab/leased_gpu/gpu_peer_quality.sh [overrides of ours...]   # carry .whl
#   OURS_B="head.norm_output=true ..." adds a third run beside them: ours with those overrides
#   (an A/B of our options at the same budget, packed as oursb/)
#   ONLY=peer, then ONLY=ours (one call each): each run alone on the GPU for MINUTES, where side
#   by side the faster loop takes more of the GPU (docs/records/2026-12-01-equal-budget-vs-speculators.md has both)
#   bash lab/leased_gpu/gpu_quality_run.sh fetch peerq 4                       # parts this call did not return
#   (fetch peerq-ours 4 after ONLY=ours)
# (MINUTES + ~1.5 min of start-up, export and replays must fit the call's 10 minutes; the peer
# cannot resume, so the budget is one call's.) Here:
#   bash lab/leased_gpu/gpu_unpack.sh outputs/peerq <sha256> <parts>     # -> ours/ peer/ dataset/manifest.json
#   python bench/peer_quality.py table --run ours=outputs/peerq/ours --run peer=outputs/peerq/peer \
#       --dataset-dir outputs/peerq/dataset --target .cache/targets/smollm2_135m-bf16-98362432
#   (with /tmp/sharegpt.jsonl recreated from .gpu/sharegpt.jsonl.xz: the val prompts are read from it)
TMPD=${TMPD:-/tmp}  # the rented machine's scratch disk: everything these calls leave lives here
set -uo pipefail
MINUTES=${MINUTES:-5}
PKG=$TMPD/eagle3_pkgs
OUTD=${OUT:-$TMPD/out}; mkdir -p "$OUTD"
# speculators, pydantic and their pure-Python dependencies travel as wheels (bench/README.md)
[ -d $PKG/spec ] || python3 -m pip install -q --no-index --no-deps --target $PKG/spec .whl/*.whl || exit 3
export PYTHONPATH=$PKG/spec:$PKG/site:$PKG:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# the dataset extract wrote (DATASET_DIR when several are there)
DS=${DATASET_DIR:-$(dirname "$(ls -t $TMPD/data/*/manifest.json | head -1)")}
[ -f "$DS/manifest.json" ] || { echo "no dataset under $TMPD/data: run gpu_quality_run.sh extract first" >&2; exit 3; }
SECS=$(python3 -c "print(round(float('$MINUTES') * 60))")
MAX_TIME=$(printf '00:00:%02d:%02d' $((SECS / 60)) $((SECS % 60)))
nvidia-smi --query-gpu=name,memory.used --format=csv 2>/dev/null || true
echo "dataset $DS, $MINUTES min each ($MAX_TIME)"
# ONLY=ours|oursb|peer: that run alone on the GPU (one call per run, the same MINUTES each): the
# equal budget without one process starving another of the GPU
RUNS=${ONLY:-ours ${OURS_B:+oursb} peer}
train_ours() {  # NAME [overrides...]: ours through gpu_quality_run.sh's train stage
  local name=$1; shift
  RETURN_PARTS=0 RUN_DIR=$TMPD/run-$name OUT=$OUTD/$name bash lab/leased_gpu/gpu_quality_run.sh train \
    train.max_time=$MAX_TIME "$@" > "$OUTD/$name.log" 2>&1
}
for r in $RUNS; do
  case $r in
    ours) train_ours ours "$@" & ;;
    # word splitting of $OURS_B is wanted: it holds several overrides
    oursb) train_ours oursb $OURS_B "$@" & ;;
    peer) python3 bench/peer_quality.py train-peer --dataset-dir "$DS" --cache-dir $TMPD/cache --minutes "$MINUTES" \
            --out $TMPD/run-peer > "$OUTD/peer.log" 2>&1 & ;;
    *) echo "ONLY: expected ours, oursb or peer, got $r" >&2; exit 2 ;;
  esac
done
wait
rm -rf "$OUTD/ours" "$OUTD/oursb"  # empty: ours' own pack stays in $TMPD/pack-run-ours
for r in $RUNS; do echo "== $r"; grep -vE "^\s*$|^-rw|^total|^d" "$OUTD/$r.log" | tail -12; done
R=(python3 bench/peer_quality.py replay --dataset-dir "$DS")
for r in $RUNS; do
  "${R[@]}" --export-dir $TMPD/run-$r/export --out $TMPD/run-$r/replay.json
  [ "$r" = peer ] && continue
  python3 bench/peer_quality.py tokens --run-dir $TMPD/run-$r --out $TMPD/run-$r/tokens.json
  # the same replay through speculators' model (how the peer is replayed): the two paths must agree
  [ "$r" = ours ] && "${R[@]}" --export-dir $TMPD/run-ours/export --impl speculators --out $TMPD/run-ours/replay_speculators.json
done
# One pack for both (layout of gpu_unpack.sh: dataset_manifest.json at the top), cut in 15 MiB
# parts: a call returns at most 8 files and 64 MiB, so RETURN_PARTS (4) come back now, the
# rest with `bash lab/leased_gpu/gpu_quality_run.sh fetch peerq 4` while the machine is warm.
PACK=$TMPD/pack-peerq${ONLY:+-$ONLY}; rm -rf "$PACK" "$PACK".tar*; mkdir -p "$PACK"
for r in $RUNS; do
  mkdir -p "$PACK/$r/export"
  cp $TMPD/run-$r/export/config.json $TMPD/run-$r/export/model.safetensors "$PACK/$r/export/"
  cp $TMPD/run-$r/replay*.json "$OUTD/$r.log" "$PACK/$r/"
  if [ "$r" = peer ]; then cp $TMPD/run-peer/peer_train.json "$PACK/peer/"; continue; fi
  cp $TMPD/run-$r/summary.json $TMPD/run-$r/tokens.json "$PACK/$r/"
  cp $TMPD/run-$r/.hydra/config.yaml "$PACK/$r/train_config.yaml"
done
cp "$DS/manifest.json" "$PACK/dataset_manifest.json"
tar -C "$PACK" -cf "$PACK.tar" . && split -b 15M -d "$PACK.tar" "$PACK.tar.part"
echo "pack $(basename "$PACK"): $(ls "$PACK".tar.part* | wc -l) parts, sha256 $(sha256sum "$PACK.tar" | cut -d' ' -f1)"
ls "$PACK".tar.part* | head -n "${RETURN_PARTS:-4}" | xargs -r cp -t "$OUTD/"
ls -la "$OUTD"
