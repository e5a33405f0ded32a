#!/usr/bin/env bash
# One device round for programmatic dependent launch (issue 13, opt-in `--dependent-launch`):
# `mucc run --check --all --dependent-launch` on the corpus files with programmatic launches;
# compute-sanitizer on two of them; `mucc bench --check` with plain launches (the default) and
# with `--dependent-launch`, next to PyTorch, same run. (The `mucc build` step checks the
# default code; goldens/threadblock/mha_bs1.g1.sm_90a.cu holds a programmatic host entry.)
#   bash scripts/gpu/pdl_round.sh CARRY OUT      (MUCC_ROUND_STEPS: check sanitize built bench)
set -u
C="$1"; O="$2"; mkdir -p "$O"
export LD_LIBRARY_PATH="$C:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
steps=" ${MUCC_ROUND_STEPS:-check sanitize built bench} "
F="${MUCC_ROUND_FILES:-gqa_bs1 gqa_bs8 mha_bs1 mha_bs8 mqa_bs1 mqa_bs8 qknorm_gqa_bs1 qknorm_gqa_bs8 single_mqa_bs1}"
files=(); for f in $F; do files+=("$C/corpus/$f.json"); done
if [[ "$steps" == *" check "* ]]; then
  echo "== check, --dependent-launch (programmatic launches)"
  MUCC_GPU_TEST_STEPS="check" MUCC_GPU_TEST_ARGS="--dependent-launch" bash scripts/gpu-test.sh "$C" "$O/check" "${files[@]}"
fi
if [[ "$steps" == *" sanitize "* ]]; then
  echo "== sanitizers"
  for fg in ${MUCC_ROUND_SANITIZE:-mha_bs1:1 qknorm_gqa_bs1:0}; do
    f=${fg%%:*}; g=${fg##*:}; sc=0.5; case $f in qknorm*) sc=0.2;; esac
    for tool in memcheck racecheck synccheck; do
      compute-sanitizer --tool $tool --print-limit 20 "$C/mucc" run "$C/corpus/$f.json" --graph "$g" --check --dependent-launch --scale $sc \
        > "$O/$f.$g.$tool.log" 2>&1
      printf '%-16s graph %-3s %-10s %s | %s\n' "$f" "$g" "$tool" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/$f.$g.$tool.log" | tail -1)" "$(grep -E 'passed' "$O/$f.$g.$tool.log" | tail -1)"
    done
  done
fi
if [[ "$steps" == *" built "* ]]; then
  echo "== mucc build path"
  bash scripts/gpu/check_built.sh "$C" "$O/built" "$C/corpus/mha_bs1.json:1" "$C/corpus/gqa_bs1.json:0" 2>&1 | tail -5
fi
if [[ "$steps" == *" bench "* ]]; then
  echo "== bench"
  B="${MUCC_ROUND_BENCH:-mha_bs1 gqa_bs1 mqa_bs1 qknorm_gqa_bs1}"
  for p in plain auto; do
    mkdir -p "$O/bench-$p"
    flag=""; [ $p = auto ] && flag="--dependent-launch"
    for f in $B; do
      sc=0.5; case $f in qknorm*) sc=0.2;; esac
      "$C/mucc" bench "$C/corpus/$f.json" --all --check $flag --scale $sc --json-out "$O/bench-$p/$f.bench.json" --force \
        > "$O/bench-$p/$f.bench.txt" 2>&1
      printf '%-6s %-16s %s\n' "$p" "$f" "$(grep '^fastest' "$O/bench-$p/$f.bench.txt" | tail -1)"
    done
  done
  python3 scripts/bench_vs_torch.py --mucc-json "$O/bench-auto" --corpus "$C/corpus" --only $B --save-torch "$O/torch.json" > "$O/table-auto.md" 2>&1
  python3 scripts/bench_vs_torch.py --mucc-json "$O/bench-plain" --corpus "$C/corpus" --only $B --torch-json "$O/torch.json" > "$O/table-plain.md" 2>&1
  echo "-- --dependent-launch (programmatic launches)"; cat "$O/table-auto.md"
  echo "-- default (plain launches)"; cat "$O/table-plain.md"
fi
