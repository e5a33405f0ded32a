#!/usr/bin/env bash
# On a GPU machine (no Rust there): transpiles every golden kernel-level graph with the carried
# mucc binary, dumps inputs and f64 references, builds and runs the generated code, compares.
#
#   scripts/gpu/check_kernel_level.sh CARRY_DIR [OUT_DIR]
#
# CARRY_DIR holds the release `mucc` binary and Debian's libz3.so.4 (built on the development
# machine). Needs nvcc and PyTorch on the GPU machine.
set -euo pipefail
carry="$1"
out="${2:-/tmp/mucc-gpu-check}"
export LD_LIBRARY_PATH="$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work="$(mktemp -d)"
for json in golden/kernel/*.json; do
    [[ "$json" == *.plan.json ]] && continue
    name="$(basename "$json" .json)"
    # Attention has no max subtraction: keep exp(Q·K) finite in fp16.
    scale=1.0
    case "$name" in attention_*) scale=0.5 ;; esac
    "$carry/mucc" transpile "$json" --arch sm_90a -o "$work/$name.cu" --plan "$work/$name.plan.json"
    "$carry/mucc" eval "$json" --scale "$scale" --dump "$work/$name" > /dev/null
done
mkdir -p "$out"
python3 scripts/gpu/check_kernel_level.py "$work" runtime-headers 2>&1 | tee "$out/check_kernel_level.log"
# With MUCC_SANITIZE=1, run it again under compute-sanitizer's memcheck (every access checked).
if [ "${MUCC_SANITIZE:-0}" = 1 ]; then
    compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
        python3 scripts/gpu/check_kernel_level.py "$work" runtime-headers 2>&1 | tee "$out/memcheck.log" | tail -5
fi
