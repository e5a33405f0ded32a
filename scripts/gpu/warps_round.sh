#!/usr/bin/env bash
# CTA shape (issue 14, item 1): `mucc tune` on the decode graphs and on the fastest candidates of
# the corpus benchmark files, which tries the default CTA and 4, 8 and 16 warps per CTA (besides
# the path variants), each checked against the interpreter and timed. One JSON per graph.
#   bash scripts/gpu/warps_round.sh CARRY OUT [SECONDS]     (stops starting graphs after SECONDS)
set -u
C="$1"; O="$2"; LIMIT="${3:-540}"; mkdir -p "$O/tune"
export LD_LIBRARY_PATH="$C:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
one() {  # FILE GRAPH NAME
  if (( $(date +%s) - start > LIMIT )); then echo "skipped $3 (time)"; return; fi
  timeout 120 "$C/mucc" tune "$1" --graph "$2" --json --retune > "$O/tune/$3.json" 2> "$O/tune/$3.err" \
    || echo "$3: tune failed: $(tail -2 "$O/tune/$3.err")"
}
for f in "$C"/decode/*.json; do one "$f" 0 "$(basename "$f" .json)"; done
# file:graphs — the fastest candidates of earlier runs (docs/benchmarks.md)
for spec in gated_mlp:30,31,6 rmsnorm_bs1:6,16 rmsnorm_bs8:7,8,19 gqa_bs1:18,24 gqa_bs8:8 \
            mqa_bs1:4 mqa_bs8:3 mha_bs1:0,4 mha_bs8:25 ntrans_bs1:1 ntrans_bs8:3 lora:2 \
            single_gated_mlp:0 qknorm_gqa_bs1:108; do
  file="${spec%%:*}"; for x in $(echo "${spec#*:}" | tr , " "); do
    one "$C/corpus/$file.json" "$x" "$file.g$x"; done
done
echo "done in $(( $(date +%s) - start )) s"
python3 scripts/gpu/tune_summary.py "$O/tune" > "$O/summary.md"
cat "$O/summary.md"
tar czf "$O/tune.tgz" -C "$O" tune && rm -rf "$O/tune"
