#!/usr/bin/env bash
# The numerical checks and sanitizers of scripts/gpu-test.sh as parallel jobs, for a GPU
# machine with many cores (checks are mostly host work: planning, NVRTC, the f64 interpreter),
# with a deadline so that one call of a time-limited machine returns what finished:
#
#   scripts/gpu/parallel_checks.sh CARRY OUT [FILE:GRAPH ...]
#
#   * `mucc run FILE --all --check --scale 1` on every corpus file (CARRY/corpus), and
#     `--all --check` on CARRY/generated/*.json, CARRY/decode/*.json, CARRY/attn/*.json when
#     those folders exist (docs/gpu-checks.md says how to write them);
#   * compute-sanitizer memcheck, racecheck and synccheck (`mucc run --graph N --check`, attention
#     files at input scale 0.5, qknorm at 0.2) on graph 0 of every corpus file and on every
#     FILE:GRAPH given (FILE a corpus file's name without .json, e.g. mha_bs8:30);
#   * python/tests/test_gpu.py in the background when CARRY/py holds the installed package.
#
# JOBS (default 12) jobs at a time, the largest files first; BUDGET_S (default 480) seconds
# after the start no new job starts and running ones are stopped. OUT gets one log per job,
# results.txt (one line per job: exit status, seconds, last line) and a summary on stdout:
# racecheck hazards are counted apart for mucc's kernels and cuBLAS's nvjet kernels (those are
# cuBLAS's own). Exit status 0 only when every job passed and none was skipped.
set -u
carry="$1"; out="$2"; shift 2
mkdir -p "$out/log"
export LD_LIBRARY_PATH="$carry:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
m="$carry/mucc"
jobs="$out/jobs.txt"; : > "$jobs"; : > "$out/results.txt"
scale_of() { case "$1" in qknorm_*) echo 0.2;; *gqa_*|*mha_*|*mqa_*) echo 0.5;; *) echo 1.0;; esac; }
sanitize() {
    local f="$carry/corpus/$1.json" s; s=$(scale_of "$1")
    for t in racecheck memcheck synccheck; do
        local e="--error-exitcode 3"; [ "$t" = racecheck ] && e=""
        echo "s_$1.g$2.$t compute-sanitizer --tool $t $e --print-limit 100 $m run $f --graph $2 --check --scale $s" >> "$jobs"
    done
}
# Largest first: the corpus files by size, then the sanitizers asked for, then the rest.
for f in $(ls -S "$carry"/corpus/*.json); do
    n=$(basename "$f" .json); echo "c_$n $m run $f --all --check --scale 1" >> "$jobs"
done
for spec in "$@"; do sanitize "${spec%%:*}" "${spec##*:}"; done
for d in generated decode attn; do
    for f in "$carry/$d"/*.json; do
        [ -e "$f" ] || continue
        echo "${d:0:1}_$(basename "$f" .json) $m run $f --all --check" >> "$jobs"
    done
done
for f in "$carry"/corpus/*.json; do sanitize "$(basename "$f" .json)" 0; done
deadline=$(( $(date +%s) + ${BUDGET_S:-480} ))
job() {
    local name=$1; shift
    local t0; t0=$(date +%s)
    local left=$(( deadline - t0 ))
    if [ "$left" -lt 20 ]; then echo "$name SKIPPED (deadline)" >> "$out/results.txt"; return; fi
    timeout "$left" "$@" > "$out/log/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t0 ))s | $(tail -1 "$out/log/$name.log" | cut -c1-160)" >> "$out/results.txt"
}
export -f job; export out deadline
t0=$(date +%s)
if [ -d "$carry/py/mucc" ]; then
    ( PYTHONPATH="$carry/py" MUCC_CORPUS="$carry/corpus" timeout "${BUDGET_S:-480}" \
        python3 python/tests/test_gpu.py > "$out/test_gpu.log" 2>&1
      echo "test_gpu rc=$?" >> "$out/test_gpu.log" ) &
fi
xargs -P "${JOBS:-12}" -L1 bash -c 'job "$@"' _ < "$jobs"
wait
echo "all jobs in $(( $(date +%s) - t0 )) s"
[ -f "$out/test_gpu.log" ] && tail -2 "$out/test_gpu.log"
grep -v '^s_' "$out/results.txt" | sort
status=0
for l in "$out"/log/s_*.log; do
    [ -e "$l" ] || continue
    n=$(basename "$l" .log)
    case $n in
        *racecheck)
            ours=$(grep 'Race reported' "$l" | grep -vc nvjet_)
            theirs=$(grep 'Race reported' "$l" | grep -c nvjet_)
            [ "$ours" = 0 ] || status=1
            echo "$n: $ours hazards in mucc kernels, $theirs in cuBLAS nvjet kernels";;
        *) echo "$n: $(grep 'ERROR SUMMARY' "$l" | tail -1)";;
    esac
done
grep -v ' rc=0 ' "$out/results.txt" && status=1
grep -h 'input scale lowered' "$out"/log/c_*.log > /dev/null 2>&1 && \
    echo "input scales lowered (corpus):" && grep -h 'input scale lowered' "$out"/log/c_*.log | head -20
exit $status
