#!/usr/bin/env bash
# Two smollm2_full trainings side by side on a 2-GPU machine, one per GPU, on the same
# dataset (extracted first by gpu_quality_run.sh extract): an A/B of two configs in one lease.
#   bash lab/leased_gpu/gpu_ab_train.sh "<overrides of A>" "<overrides of B>" [overrides of both...]
#   e.g. bash lab/leased_gpu/gpu_ab_train.sh "train.max_steps=4600" "head.intermediate_size=6144" data.regen_max_turns=2
# A second call with ckpt_path=last (and a larger train.max_time) continues both.
# Logs come back ($OUT/A.log, $OUT/B.log, with each pack's sha256); the results stay on the
# machine (two packs are over one call's return cap): fetch them in calls right after,
#   bash lab/leased_gpu/gpu_quality_run.sh fetch runA 0, ... fetch runA 4, fetch runB 0, ...
# and here: bash lab/leased_gpu/gpu_unpack.sh outputs/ab/A <sha256> <parts in order>.
TMPD=${TMPD:-/tmp}  # the rented machine's scratch disk: everything these calls leave lives here
set -uo pipefail
A=$1; B=$2; shift 2
OUTD=${OUT:-$TMPD/out}; mkdir -p "$OUTD"
# word splitting of $A / $B is wanted: each holds several overrides
RETURN_PARTS=0 RUN_DIR=$TMPD/runA OUT=$OUTD/A CUDA_VISIBLE_DEVICES=0 bash lab/leased_gpu/gpu_quality_run.sh train $A "$@" > "$OUTD/A.log" 2>&1 &
RETURN_PARTS=0 RUN_DIR=$TMPD/runB OUT=$OUTD/B CUDA_VISIBLE_DEVICES=1 bash lab/leased_gpu/gpu_quality_run.sh train $B "$@" > "$OUTD/B.log" 2>&1 &
wait
rm -rf "$OUTD/A" "$OUTD/B"  # empty: every part waits in $TMPD/pack-runA.tar.part*, $TMPD/pack-runB.tar.part*
for r in A B; do echo "== $r"; grep -vE "^\s*$" "$OUTD/$r.log" | grep -v "^-rw\|^total\|^d" | tail -16; done
