#!/usr/bin/env bash
# One device round for the TMA loads of pipelined inputs (issue 13): `mucc run --check --all` on
# the corpus files with TMA kernels and on the decode graphs (default path: TMA on sm_90a);
# compute-sanitizer memcheck, racecheck and synccheck on TMA graphs; `mucc bench --check` with
# `--path ampere` and the default path next to PyTorch, in the same run.
#   bash scripts/gpu/tma_round.sh CARRY OUT      (MUCC_ROUND_STEPS: check sanitize bench decode-bench)
set -u
C="$1"; O="$2"; mkdir -p "$O"
export LD_LIBRARY_PATH="$C:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
steps=" ${MUCC_ROUND_STEPS:-check sanitize decode-bench bench} "
F="${MUCC_ROUND_FILES:-gated_mlp gqa_bs1 gqa_bs8 mha_bs8 mqa_bs1 mqa_bs8 rmsnorm_bs1 rmsnorm_bs8 single_gated_mlp single_mqa_bs1}"
files=(); for f in $F; do files+=("$C/corpus/$f.json"); done
if [[ "$steps" == *" check "* ]]; then
  echo "== check, default path (TMA)"
  MUCC_GPU_TEST_STEPS="check decode" bash scripts/gpu-test.sh "$C" "$O/check" "${files[@]}"
fi
if [[ "$steps" == *" sanitize "* ]]; then
  echo "== sanitizers on TMA graphs"
  for fg in ${MUCC_ROUND_SANITIZE:-corpus/rmsnorm_bs1:6 corpus/gated_mlp:0 corpus/mqa_bs1:0 decode/decode_m8_f16_3584x4608:0}; do
    f=${fg%%:*}; g=${fg##*:}; sc=1.0; case $f in *gqa*|*mha*|*mqa*) sc=0.5;; esac
    n=$(basename "$f")
    for tool in memcheck racecheck synccheck; do
      compute-sanitizer --tool $tool --print-limit 20 "$C/mucc" run "$C/$f.json" --graph "$g" --check --scale $sc \
        > "$O/$n.$g.$tool.log" 2>&1
      printf '%-28s graph %-3s %-10s %s | %s\n' "$n" "$g" "$tool" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/$n.$g.$tool.log" | tail -1)" "$(grep -E 'passed' "$O/$n.$g.$tool.log" | tail -1)"
    done
  done
fi
if [[ "$steps" == *" decode-bench "* ]]; then
  echo "== decode bench"
  for p in ampere auto; do
    mkdir -p "$O/dbench-$p"
    for f in "$C"/decode/*.json; do
      n=$(basename "$f" .json)
      "$C/mucc" bench "$f" --check --path $p --json-out "$O/dbench-$p/$n.bench.json" --force > "$O/dbench-$p/$n.txt" 2>&1 \
        || echo "$p $n: bench failed: $(tail -2 "$O/dbench-$p/$n.txt")"
    done
  done
  python3 scripts/gpu/decode_vs_torch.py --decode "$C/decode" --bench ampere="$O/dbench-ampere" auto="$O/dbench-auto" 2>"$O/dtorch.log" \
    || tail -5 "$O/dtorch.log"
fi
if [[ "$steps" == *" bench "* ]]; then
  echo "== bench"
  B="${MUCC_ROUND_BENCH:-rmsnorm_bs1 rmsnorm_bs8 gated_mlp single_gated_mlp}"
  for p in ampere auto; do
    mkdir -p "$O/bench-$p"
    for f in $B; do
      sc=1.0; case $f in *gqa*|*mha*|*mqa*) sc=0.5;; esac
      "$C/mucc" bench "$C/corpus/$f.json" --all --check --path $p --scale $sc --json-out "$O/bench-$p/$f.bench.json" --force \
        > "$O/bench-$p/$f.bench.txt" 2>&1
      printf '%-7s %-18s %s\n' "$p" "$f" "$(grep '^fastest' "$O/bench-$p/$f.bench.txt" | tail -1)"
    done
  done
  python3 scripts/bench_vs_torch.py --mucc-json "$O/bench-auto" --corpus "$C/corpus" --only $B --save-torch "$O/torch.json" > "$O/table-auto.md" 2>&1
  python3 scripts/bench_vs_torch.py --mucc-json "$O/bench-ampere" --corpus "$C/corpus" --only $B --torch-json "$O/torch.json" > "$O/table-ampere.md" 2>&1
  echo "-- default path (TMA + cluster split)"; cat "$O/table-auto.md"
  echo "-- ampere path"; cat "$O/table-ampere.md"
fi
