#!/usr/bin/env bash
# The nvcc-built path on a GPU machine (no Rust there): what `mucc build` and the build-script
# bindings ship, which scripts/gpu-test.sh (NVRTC, in process) does not exercise. Transpiles
# graphs with the carried mucc binary, dumps their inputs and f64 references (`mucc eval
# --dump`), builds each `.cu` with nvcc into a shared library, calls its host entry
# `mucc_execute` through ctypes on PyTorch buffers (scripts/gpu/check_kernel_level.py) and
# compares every output. Needs nvcc and PyTorch on the GPU machine.
#
#   scripts/gpu/check_graphs.sh CARRY_DIR OUT_DIR ARCH FILE:GRAPH[:SCALE] ...
#
# e.g. every golden graph, attention at input scale 0.5:
#   scripts/gpu/check_graphs.sh carry /tmp/cg sm_90a $(for j in golden/kernel/*.json \
#     golden/threadblock/*.json; do case $j in *.plan.json) ;; *attention_*) echo $j:0:0.5;; \
#     *) echo $j:0;; esac; done)
#
# CARRY_DIR holds the release `mucc` binary and Debian's libz3.so.4. SCALE (default 1) is the
# half-width of the random inputs: attention graphs (no max subtraction) need less than 1 so that
# exp(Q·K) stays finite in fp16; it is halved further while `mucc eval` reports a stored tensor
# beyond its dtype's range. Preparation and builds run in parallel; graphs run one after the
# other in a worker process that is restarted after a fault. MUCC_SANITIZE=1 also runs each graph
# under compute-sanitizer memcheck, MUCC_RACECHECK=1 under racecheck (logs in OUT_DIR).
set -euo pipefail
carry="$1"; out="$2"; arch="$3"; shift 3
export LD_LIBRARY_PATH="$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work="$(mktemp -d)"
mkdir -p "$out"
prepare() {
    local spec="$1" json graph scale name
    IFS=: read -r json graph scale <<< "$spec"
    scale="${scale:-1.0}"
    name="$(basename "$json" .json).g$graph"
    if ! "$carry/mucc" transpile "$json" --graph "$graph" --arch "$arch" -o "$work/$name.cu" --plan "$work/$name.plan.json" 2> "$work/$name.err"; then
        echo "$name: transpile failed: $(tail -1 "$work/$name.err")"
        rm -f "$work/$name.cu"
        return 0
    fi
    # Halve the input scale while a tensor the compiled graph stores would overflow its dtype
    # (the f64 reference stays finite there; `mucc eval` warns "beyond the largest finite").
    local tries=0
    while :; do
        rm -rf "${work:?}/$name"
        if ! "$carry/mucc" eval "$json" --graph "$graph" --scale "$scale" --dump "$work/$name" > /dev/null 2> "$work/$name.eval.err"; then
            echo "$name: eval failed: $(tail -1 "$work/$name.eval.err")"; rm -f "$work/$name.cu"; return 0
        fi
        grep -q "beyond the largest finite" "$work/$name.eval.err" || break
        tries=$((tries + 1))
        if [ "$tries" -ge 8 ]; then
            echo "$name: tensors overflow their dtype even at input scale $scale"; rm -f "$work/$name.cu"; return 0
        fi
        scale=$(python3 -c "print($scale / 2)")
        echo "$name: input scale lowered to $scale ($(grep -o '%[0-9]* \[[^]]*\] [a-z0-9]* reaches |x| = [0-9.e+-]*' "$work/$name.eval.err" | head -1))"
    done
}
export -f prepare
export carry work arch
t0=$(date +%s)
printf '%s\n' "$@" | xargs -P "$(nproc)" -I{} bash -c 'prepare "$1"' _ {}
echo "prepared $# graphs in $(( $(date +%s) - t0 )) s"
python3 scripts/gpu/check_kernel_level.py "$work" runtime-headers 2>&1 | tee "$out/check.log" || true
if [ "${MUCC_SANITIZE:-0}" = 1 ]; then
    # One process per graph under memcheck (libraries are already built).
    for cu in "$work"/*.cu; do
        name="$(basename "$cu" .cu)"
        compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 10 \
            python3 scripts/gpu/check_kernel_level.py --one "$work" "$name" runtime-headers > "$out/$name.memcheck.log" 2>&1 || true
        echo "$name memcheck: $(grep -E 'ERROR SUMMARY' "$out/$name.memcheck.log" | tail -1)"
    done
fi
if [ "${MUCC_RACECHECK:-0}" = 1 ]; then
    for cu in "$work"/*.cu; do
        name="$(basename "$cu" .cu)"
        compute-sanitizer --tool racecheck --racecheck-report analysis --error-exitcode 3 --print-limit 10 \
            python3 scripts/gpu/check_kernel_level.py --one "$work" "$name" runtime-headers > "$out/$name.racecheck.log" 2>&1 || true
        echo "$name racecheck: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$name.racecheck.log" | tail -1)"
    done
fi
