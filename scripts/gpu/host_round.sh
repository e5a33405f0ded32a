#!/usr/bin/env bash
# The generated host entries on a GPU after a change to them: the example crate (its bindings and
# entries, named per crate) with memcheck; `mucc build`-style files whose kernels need more than
# 48 KiB of dynamic shared memory (mucc::host::max_dynamic_smem) and the kernel-level goldens
# that call cuBLAS (mucc::host::cublas_handle), each checked against the f64 reference.
#   bash scripts/gpu/host_round.sh CARRY OUT
set -uo pipefail
carry="$1"; out="$2"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH="$PWD/$carry:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== example crate (examples/rust-embed)"
"$carry/rust-embed" examples/rust-embed; echo "exit status $?"
echo "== compute-sanitizer memcheck on the example"
compute-sanitizer --tool memcheck --error-exitcode 3 "$carry/rust-embed" examples/rust-embed 2>&1 | grep -E "ERROR SUMMARY|match|MISMATCH" | tail -4
echo "== host entries with > 48 KiB dynamic shared memory"
bash scripts/gpu/check_built.sh "$carry" "$out/built" "$carry/corpus/mha_bs1.json:1" \
  "$carry/corpus/rmsnorm_bs1.json:2" "$carry/corpus/mha_bs1.json:0" "$carry/corpus/gqa_bs1.json:0" 2>&1 | tail -8
echo "== kernel-level goldens (cuBLAS), with memcheck"
MUCC_SANITIZE=1 bash scripts/gpu/check_kernel_level.sh "$carry" "$out/kl" 2>&1 | tail -14
