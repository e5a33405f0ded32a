#!/usr/bin/env bash
# GPU test on a GPU machine (no Rust needed):
#   check     `mucc run --check --all` on every corpus file (numerical check of every graph);
#   sanitize  compute-sanitizer memcheck and racecheck on graph 0 of each file;
#   bench     `mucc bench --all` on every file (table in NAME.bench.txt, JSON in NAME.bench.json).
#
#   scripts/gpu-test.sh CARRY OUT [FILE.json ...]
#
# CARRY holds the release `mucc` binary and Debian's libz3.so.4 (and, by default, the corpus
# under CARRY/corpus); OUT receives one log per file and step.
# MUCC_GPU_TEST_STEPS picks the steps (default "check sanitize bench"); MUCC_GPU_TEST_GRAPHS
# selects the graphs for check and bench ("--all", the default, or e.g. "--graph 0").
# Input scales: attention files 0.5 and qknorm files 0.2 (their programs exponentiate
# un-normalised scores, which overflow fp16 tiles at 1.0); `mucc run --check` halves the scale
# further by itself while a stored tensor or tile would overflow. Exit status 0 only when every
# step passed.
set -u
carry="$1"; out="$2"; shift 2
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
files=("$@")
[ ${#files[@]} -eq 0 ] && files=("$carry"/corpus/*.json)
sel="${MUCC_GPU_TEST_GRAPHS:---all}"
steps=" ${MUCC_GPU_TEST_STEPS:-check sanitize bench} "
status=0
scale_of() {
    case "$1" in qknorm_*) echo 0.2;; *gqa_*|*mha_*|*mqa_*) echo 0.5;; *) echo 1.0;; esac
}
for f in "${files[@]}"; do
    name="$(basename "$f" .json)"
    scale="$(scale_of "$name")"
    if [[ "$steps" == *" check "* ]]; then
        t0=$(date +%s)
        # shellcheck disable=SC2086
        "$carry/mucc" run "$f" $sel --check --scale "$scale" > "$out/$name.run.log" 2>&1 || status=1
        printf '%-26s %s (%d s)\n' "$name" "$(tail -1 "$out/$name.run.log")" "$(( $(date +%s) - t0 ))"
    fi
    if [[ "$steps" == *" sanitize "* ]]; then
        compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
            "$carry/mucc" run "$f" --graph 0 --check --scale "$scale" > "$out/$name.memcheck.log" 2>&1 || status=1
        printf '%-26s memcheck: %s\n' "$name" "$(grep -E 'ERROR SUMMARY' "$out/$name.memcheck.log" | tail -1)"
        # racecheck also reports hazards inside cuBLAS's own sm_90 GEMM kernels (nvjet_*, used
        # for kernel-level matmuls); excluding them makes the sanitizer fail, so count apart.
        compute-sanitizer --tool racecheck --print-limit 100 \
            "$carry/mucc" run "$f" --graph 0 --check --scale "$scale" > "$out/$name.racecheck.log" 2>&1 || status=1
        ours=$(grep 'Race reported' "$out/$name.racecheck.log" | grep -vc 'nvjet_')
        theirs=$(grep 'Race reported' "$out/$name.racecheck.log" | grep -c 'nvjet_')
        [ "$ours" = 0 ] || status=1
        printf '%-26s racecheck: %s hazards in mucc kernels, %s in cuBLAS nvjet kernels\n' "$name" "$ours" "$theirs"
    fi
    if [[ "$steps" == *" bench "* ]]; then
        t0=$(date +%s)
        # shellcheck disable=SC2086
        "$carry/mucc" bench "$f" $sel --scale "$scale" --json-out "$out/$name.bench.json" --force \
            > "$out/$name.bench.txt" 2>&1 || status=1
        printf '%-26s bench: %s (%d s)\n' "$name" "$(grep '^fastest' "$out/$name.bench.txt" | tail -1)" "$(( $(date +%s) - t0 ))"
    fi
done
exit $status
