#!/usr/bin/env bash
# Narrow chunked copies (8- and 4-byte cp.async for rows that are no whole number of 16-byte
# chunks) on a GPU: the decode graphs (whose X and Y rows of k/64 elements needed them) checked
# on both paths, sanitized, benched next to PyTorch; then the corpus checked.
#   bash scripts/gpu/chunks_round.sh CARRY OUT [decode|corpus]
set -u
C="$1"; O="$2"; what="${3:-decode}"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH="$PWD/$C:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
if [ "$what" = decode ]; then
  for g in decode_m1_bf16_11008x2048 decode_m8_f16_18944x3584; do
    for tool in memcheck racecheck synccheck; do
      r="$(compute-sanitizer --tool $tool --error-exitcode 3 "$C/mucc" run "$C/decode/$g.json" --check 2>&1)"
      echo "$g $tool: rc=$? $(echo "$r" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed' | tr '\n' ' ')"
    done
  done
  bash scripts/gpu/decode_round.sh "$C" "$O/decode"
else
  MUCC_GPU_TEST_STEPS=check bash scripts/gpu-test.sh "$C" "$O/corpus"; echo "corpus check exit $?"
  for f in "$O"/corpus/*.run.log; do echo "$(basename "$f" .run.log): $(tail -1 "$f")"; done
fi
