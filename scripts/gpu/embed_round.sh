#!/usr/bin/env bash
# Issue 17 on a GPU: the example crate's binary (examples/rust-embed, built here and carried as
# CARRY/rust-embed) runs both graphs through its generated bindings and compares them with the
# reference interpreter; compute-sanitizer memcheck on it; `mucc build` + examples/run_so.py on
# gated_mlp (the shared nvcc path); then `mucc run --check --all` over CARRY/corpus.
#   bash scripts/gpu/embed_round.sh CARRY
set -uo pipefail
carry="$1"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH="$PWD/$carry:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== example crate (examples/rust-embed)"
"$carry/rust-embed" examples/rust-embed; echo "exit status $?"
echo "== compute-sanitizer memcheck on the example"
compute-sanitizer --tool memcheck --error-exitcode 3 "$carry/rust-embed" examples/rust-embed 2>&1 | grep -E "ERROR SUMMARY|match|MISMATCH" | tail -4
echo "== mucc build + run_so.py"
"$carry/mucc" build "$carry/corpus/single_gated_mlp.json" --graph 0 -o /tmp/libmlp.so --force \
  && python3 examples/run_so.py /tmp/libmlp.so f16:8x4096 f16:4096x4096 f16:4096x4096 -- f16:8x4096
echo "== mucc run --check --all over the corpus"
pass=0; fail=0
for f in "$carry"/corpus/*.json; do
  name="$(basename "$f" .json)"
  scale=1.0; case "$name" in *gqa*|*mha*|*mqa*) scale=0.5 ;; esac
  log="$("$carry/mucc" run "$f" --all --check --scale "$scale" 2>&1)"; rc=$?
  line="$(echo "$log" | tail -1)"
  echo "$name: rc=$rc $line"
  p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); q=$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
  pass=$((pass + ${p:-0})); fail=$((fail + ${q:-0}))
  [ $rc -ne 0 ] && echo "$log" | tail -20
done
echo "corpus: $pass passed, $fail failed"
