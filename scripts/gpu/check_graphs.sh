#!/usr/bin/env bash
# On a GPU machine (no Rust there): transpiles graphs with the carried mucc binary, dumps their
# inputs and f64 references (`mucc eval --dump`), builds and runs the generated code, compares.
#
#   scripts/gpu/check_graphs.sh CARRY_DIR OUT_DIR ARCH FILE:GRAPH[:SCALE] ...
#
# CARRY_DIR holds the release `mucc` binary and Debian's libz3.so.4. SCALE (default 1) is the
# half-width of the random inputs: attention graphs (no max subtraction) need less than 1 so that
# exp(Q·K) stays finite in fp16. Preparation and builds run in parallel; graphs run one after the
# other in a worker process that is restarted after a fault. MUCC_SANITIZE=1 also runs each graph
# under compute-sanitizer memcheck (logs in OUT_DIR).
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
    "$carry/mucc" eval "$json" --graph "$graph" --scale "$scale" --dump "$work/$name" > /dev/null 2>> "$work/$name.err" \
        || { echo "$name: eval failed: $(tail -1 "$work/$name.err")"; rm -f "$work/$name.cu"; }
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
