#!/usr/bin/env bash
# Cluster split with a shallower ring (more resident CTAs per SM, so larger clusters): the graphs
# whose plan changed, checked with the new binary (and sanitized once), then timed old (A) /
# new (B) / old in one run.
#   bash scripts/gpu/split_round.sh CARRY OUT     (CARRY/mucc-old: the binary before)
set -u
C="$1"; O="$2"; mkdir -p "$O"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH="$PWD/$C:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
specs=()
for g in 28 29 30 31; do specs+=("$C/corpus/gated_mlp.json:$g:1.0"); done
for g in 0 5 11; do specs+=("$C/corpus/mqa_bs1.json:$g:0.5"); done
specs+=("$C/corpus/mqa_bs8.json:15:0.5" "$C/corpus/single_mqa_bs1.json:0:0.5")
specs+=("$C/corpus/rmsnorm_bs1.json:6:1.0" "$C/corpus/rmsnorm_bs1.json:16:1.0")
specs+=("$C/corpus/rmsnorm_bs8.json:3:1.0" "$C/corpus/rmsnorm_bs8.json:7:1.0")
for f in "$C"/decode/decode_*_bf16_*.json; do specs+=("$f:0:1.0"); done
echo "== check (new binary), every changed graph"
for f in gated_mlp mqa_bs1 mqa_bs8 single_mqa_bs1 rmsnorm_bs1 rmsnorm_bs8; do
  s=1.0; case $f in *mqa*) s=0.5;; esac
  echo "$f: $("$C/mucc" run "$C/corpus/$f.json" --all --check --scale $s 2>&1 | tail -1)"
done
for f in "$C"/decode/*.json; do echo "$(basename "$f"): $("$C/mucc" run "$f" --check 2>&1 | tail -1)"; done
echo "== sanitizers on a cluster-of-8 kernel (decode_m8_bf16_11008x2048) and rmsnorm_bs1 g6"
for t in memcheck racecheck synccheck; do
  for spec in "$C/decode/decode_m8_bf16_11008x2048.json:0" "$C/corpus/rmsnorm_bs1.json:6"; do
    r="$(compute-sanitizer --tool $t --error-exitcode 3 "$C/mucc" run "${spec%:*}" --graph "${spec##*:}" --check 2>&1)"
    echo "$(basename "${spec%:*}") $t: rc=$? $(echo "$r" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tr '\n' ' ')"
  done
done
echo "== A = before, B = shallower ring for larger clusters"
bash scripts/gpu/bench_pair.sh "$C/mucc-old" "$C/mucc" "$O/pair" "${specs[@]}"
