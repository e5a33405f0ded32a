#!/usr/bin/env bash
# One device round for the cluster split (issue 13): on the files whose graphs split, `mucc run
# --check --all` with the default path (Hopper on sm_90a) and with `--path ampere`;
# compute-sanitizer memcheck, racecheck and synccheck on split graphs; `mucc bench` with both
# paths next to PyTorch (scripts/bench_vs_torch.py) in the same run.
#   bash scripts/gpu/cluster_round.sh CARRY OUT
set -u
C="$1"; O="$2"; mkdir -p "$O"
export LD_LIBRARY_PATH="$C:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
steps=" ${MUCC_ROUND_STEPS:-check sanitize bench} "
F="gated_mlp gqa_bs1 gqa_bs8 mha_bs1 mqa_bs1 mqa_bs8 rmsnorm_bs1 rmsnorm_bs8 single_gated_mlp"
files=(); for f in $F; do files+=("$C/corpus/$f.json"); done
if [[ "$steps" == *" check "* ]]; then
echo "== check, default path"
MUCC_GPU_TEST_STEPS="check" bash scripts/gpu-test.sh "$C" "$O/hopper" "${files[@]}"
echo "== check, --path ampere"
MUCC_GPU_TEST_STEPS="check" MUCC_GPU_TEST_ARGS="--path ampere" bash scripts/gpu-test.sh "$C" "$O/ampere" "${files[@]}"
fi
if [[ "$steps" == *" sanitize "* ]]; then
echo "== sanitizers on split graphs"
for fg in ${MUCC_ROUND_SANITIZE:-rmsnorm_bs1:2 gated_mlp:0 mha_bs1:1 gqa_bs8:4}; do
  f=${fg%%:*}; g=${fg##*:}; sc=1.0; case $f in *gqa*|*mha*|*mqa*) sc=0.5;; esac
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool $tool --print-limit 20 "$C/mucc" run "$C/corpus/$f.json" --graph "$g" --check --scale $sc \
      > "$O/$f.$g.$tool.log" 2>&1
    printf '%-18s graph %-3s %-10s %s | %s\n' "$f" "$g" "$tool" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/$f.$g.$tool.log" | tail -1)" "$(grep -E 'passed' "$O/$f.$g.$tool.log" | tail -1)"
  done
done
fi
if [[ "$steps" == *" bench "* ]]; then
echo "== bench"
B="${MUCC_ROUND_BENCH:-rmsnorm_bs1 rmsnorm_bs8 gated_mlp single_gated_mlp mha_bs1 gqa_bs1}"
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
echo "-- default path (cluster split)"; cat "$O/table-auto.md"
echo "-- ampere path"; cat "$O/table-ampere.md"
fi
