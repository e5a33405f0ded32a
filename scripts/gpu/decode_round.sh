#!/usr/bin/env bash
# The decode graphs on a GPU (issue 13): `mucc run --check` with the default path and with
# `--path ampere`, then `mucc bench --check` with both and PyTorch in the same run.
#   bash scripts/gpu/decode_round.sh CARRY OUT      (CARRY/decode from the decode_graphs example)
set -u
C="$1"; O="$2"; mkdir -p "$O"
export LD_LIBRARY_PATH="$C:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== check, default path"
MUCC_GPU_TEST_STEPS="decode" bash scripts/gpu-test.sh "$C" "$O/check-auto"
echo "== check, --path ampere"
MUCC_GPU_TEST_STEPS="decode" MUCC_GPU_TEST_ARGS="--path ampere" bash scripts/gpu-test.sh "$C" "$O/check-ampere"
echo "== bench"
for p in ampere auto; do
  mkdir -p "$O/bench-$p"
  for f in "$C"/decode/*.json; do
    n=$(basename "$f" .json)
    "$C/mucc" bench "$f" --check --path $p --json-out "$O/bench-$p/$n.bench.json" --force > "$O/bench-$p/$n.txt" 2>&1 \
      || echo "$p $n: bench failed: $(tail -2 "$O/bench-$p/$n.txt")"
  done
done
python3 scripts/gpu/decode_vs_torch.py --decode "$C/decode" --bench ampere="$O/bench-ampere" auto="$O/bench-auto" 2>"$O/torch.log"
