#!/usr/bin/env bash
# GPU test on a GPU machine (no Rust needed): numerical check of corpus graphs with `mucc run
# --check`, and compute-sanitizer memcheck + racecheck on graph 0 of each file.
#
#   scripts/gpu-test.sh CARRY OUT [FILE.json ...]
#
# CARRY holds the release `mucc` binary and Debian's libz3.so.4 (and, by default, the corpus
# under CARRY/corpus); OUT receives one log per file and tool. MUCC_GPU_TEST_GRAPHS selects the
# graphs ("--all", the default, or e.g. "--graph 0"); MUCC_GPU_TEST_SANITIZE=0 skips the
# sanitizers. Attention files run at input scale 0.5 and qknorm files at 0.2 (their programs
# exponentiate un-normalised scores, which overflow fp16 tiles at 1.0); `mucc run` halves the
# scale further by itself when a stored kernel-level tensor would overflow.
set -u
carry="$1"; out="$2"; shift 2
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
files=("$@")
[ ${#files[@]} -eq 0 ] && files=("$carry"/corpus/*.json)
sel="${MUCC_GPU_TEST_GRAPHS:---all}"
status=0
for f in "${files[@]}"; do
    name="$(basename "$f" .json)"
    scale=1.0
    case "$name" in qknorm_*) scale=0.2;; *gqa_*|*mha_*|*mqa_*) scale=0.5;; esac
    t0=$(date +%s)
    # shellcheck disable=SC2086
    "$carry/mucc" run "$f" $sel --check --scale "$scale" > "$out/$name.run.log" 2>&1 || status=1
    printf '%-26s %s (%d s)\n' "$name" "$(tail -1 "$out/$name.run.log")" "$(( $(date +%s) - t0 ))"
    if [ "${MUCC_GPU_TEST_SANITIZE:-1}" = 1 ]; then
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
done
exit $status
