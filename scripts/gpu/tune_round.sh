#!/usr/bin/env bash
# `mucc tune` on a GPU: tunes the named corpus files (every graph), tunes the first again (from
# the cache), then `mucc run --check --all` on them with the tuned variants and with --no-tune,
# compute-sanitizer on graph 0 of the first (tuned), and the example crate's binary if carried.
#   MUCC_TUNE_FILES="gqa_bs1 gated_mlp" bash scripts/gpu/tune_round.sh CARRY
set -uo pipefail
carry="$1"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH="$PWD/$carry:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
files=(${MUCC_TUNE_FILES:-gqa_bs1})
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
scale_of() { case "$1" in *gqa*|*mha*|*mqa*) echo 0.5 ;; *) echo 1.0 ;; esac; }
if [ -x "$carry/rust-embed" ]; then
  echo "== example crate"; "$carry/rust-embed" examples/rust-embed | tail -4
fi
for f in "${files[@]}"; do
  echo "== mucc tune $f --all"
  s=$SECONDS
  "$carry/mucc" tune "$carry/corpus/$f.json" --all --scale "$(scale_of "$f")"
  echo "tune $f took $((SECONDS - s)) s"
done
f="${files[0]}"
echo "== mucc tune $f --all again (cache)"
s=$SECONDS
"$carry/mucc" tune "$carry/corpus/$f.json" --all --scale "$(scale_of "$f")" | tail -3
echo "second tune $f took $((SECONDS - s)) s"
for f in "${files[@]}"; do
  for mode in tuned --no-tune; do
    extra=""; [ "$mode" = --no-tune ] && extra=--no-tune
    echo "== mucc run --check --all $f ($mode): $("$carry/mucc" run "$carry/corpus/$f.json" --all --check --scale "$(scale_of "$f")" $extra 2>&1 | tail -1)"
  done
done
f="${files[0]}"
for tool in memcheck racecheck synccheck; do
  echo "== $tool $f g0 (tuned): $(compute-sanitizer --tool $tool "$carry/mucc" run "$carry/corpus/$f.json" --graph 0 --check --scale "$(scale_of "$f")" 2>&1 | grep -E 'ERROR SUMMARY|HAZARD|RACECHECK SUMMARY|passed' | tr '\n' ' ')"
done
