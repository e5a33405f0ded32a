#!/bin/bash
# Transpiles every test input with one mucc binary, for comparing the generated code of two
# commits byte for byte (`diff -r OUT_A OUT_B`): the corpus, 1,000 generated graphs, the 16
# decode graphs and the attention blocks on sm_80 and sm_90a, and the tensor-parallel graphs
# with both all-reduces. Inputs are made with this checkout's examples under INPUTS.
#
#   scripts/transpile-all.sh MUCC OUT [INPUTS]     (INPUTS: /tmp/mucc-inputs by default)
set -euo pipefail
mucc=$(realpath "$1")
out=$2
inputs=${3:-/tmp/mucc-inputs}
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -d "$inputs/tp" ]; then
  mkdir -p "$inputs"/{gen,attn,tp,decode}
  (cd "$root" && cargo run -q --release --example gen_graphs -- "$inputs/gen" 1000 \
    && cargo run -q --release --example attention_graphs -- "$inputs/attn" \
    && cargo run -q --release --example decode_graphs -- "$inputs/decode" \
    && cargo run -q --release --example tp_graphs -- "$inputs/tp") >/dev/null
fi
rm -rf "$out"
mkdir -p "$out"
{
  for f in "$root"/../shared/corpus/mirage-benchmarks/*.json "$inputs"/gen/*.json \
    "$inputs"/decode/*.json "$inputs"/attn/*.json; do
    for arch in sm_80 sm_90a; do
      echo "$f" "$out/$arch/$(basename "$f" .json)" --arch "$arch"
    done
  done
  for f in "$inputs"/tp/*.json; do
    for ar in nccl fused; do
      echo "$f" "$out/tp_$ar/$(basename "$f" .json)" --arch sm_90a --all-reduce "$ar"
    done
  done
} | xargs -P "$(nproc)" -L 1 sh -c \
  'd=$1; f=$0; shift; mkdir -p "$d" && "'"$mucc"'" transpile "$f" --all --no-tune --out-dir "$d" --force "$@" >/dev/null 2>&1 || echo "FAILED $f $*"'
find "$out" -type f | wc -l
