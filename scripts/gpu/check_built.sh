#!/usr/bin/env bash
# The `mucc build` path on a GPU: for each FILE:GRAPH, the carried mucc transpiles the graph for
# sm_90a (with its host entry `mucc_execute`, which encodes the TMA tensor maps itself), dumps
# inputs and f64 references; scripts/gpu/check_kernel_level.py builds each file with nvcc, calls
# `mucc_execute` through ctypes and compares every output.
#   bash scripts/gpu/check_built.sh CARRY OUT FILE.json:GRAPH...
set -euo pipefail
carry="$1"; out="$2"; shift 2
export LD_LIBRARY_PATH="$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work="$(mktemp -d)"
for fg in "$@"; do
  f="${fg%:*}"; g="${fg##*:}"
  name="$(basename "$f" .json).g$g"
  scale=1.0; case "$name" in *gqa*|*mha*|*mqa*) scale=0.5 ;; esac
  "$carry/mucc" transpile "$f" --graph "$g" --arch sm_90a -o "$work/$name.cu" --plan "$work/$name.plan.json"
  "$carry/mucc" eval "$f" --graph "$g" --scale "$scale" --dump "$work/$name" > /dev/null
done
mkdir -p "$out"
python3 scripts/gpu/check_kernel_level.py "$work" runtime-headers 2>&1 | tee "$out/check_built.log"
