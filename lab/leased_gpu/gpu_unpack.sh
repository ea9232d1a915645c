#!/usr/bin/env bash
# Here, after a GPU run's train (+ fetch) calls: reassemble its result parts, check the sha256
# the train stage printed ("pack pack-run: N parts, sha256 ..."), and lay it out for evaluate.
#   bash lab/leased_gpu/gpu_unpack.sh DIR SHA256 PART...      (parts in order: *.part00 *.part01 ...)
# -> DIR/export (config.json, model.safetensors), DIR/dataset/manifest.json, DIR/summary.json,
#    DIR/regenerated.tar.xz (carry it as .gpu/regenerated.tar.xz with the next lease's part 0)
set -euo pipefail
DIR=${1:?DIR}; SHA=${2:?SHA256}; shift 2
[ "$#" -gt 0 ] || { echo "no parts given" >&2; exit 2; }
mkdir -p "$DIR/dataset"
cat "$@" > "$DIR/pack.tar.tmp"
echo "$SHA  $DIR/pack.tar.tmp" | sha256sum -c - || { echo "parts missing or out of order: $*" >&2; exit 1; }
tar -C "$DIR" -xf "$DIR/pack.tar.tmp" && rm "$DIR/pack.tar.tmp"
mv "$DIR/dataset_manifest.json" "$DIR/dataset/manifest.json"
echo "python evaluate.py export_dir=$DIR/export dataset_dir=$DIR/dataset target=<the bf16 SmolLM2 dir in .cache/targets>"
