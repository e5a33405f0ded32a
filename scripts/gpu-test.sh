#!/usr/bin/env bash
# GPU test on a GPU machine (no Rust needed):
#   check     `mucc run --check --all` on every corpus file (numerical check of every graph);
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck on graph 0 of each file;
#   bench     `mucc bench --all` on every file (table in NAME.bench.txt, JSON in NAME.bench.json, chart in NAME.bench.svg);
#   generated `mucc run --all --check` on CARRY/generated/*.json, random valid graphs written by
#             `cargo run --release --example gen_graphs -- CARRY/generated COUNT` (not a
#             default step);
#   decode    `mucc run --check` on CARRY/decode/*.json, the builder-made decode-time linear layers
#             (`cargo run --release --example decode_graphs -- CARRY/decode`; not a default step);
#   attention `mucc run --check` on CARRY/attn/*.json, the builder-made single-kernel attention
#             blocks (`cargo run --release --example attention_graphs -- CARRY/attn`), with the
#             default CTA, with `--warps graph` (register pipes on 4 warps) and with that and
#             `--path ampere`; not a default step;
#   multi     on CARRY/multi/tpN_*.json (N >= 2), the builder-made tensor-parallel MLP and
#             attention blocks, kernel-level (tpN_mlp_*, tpN_attention_*) and fused (tpN_fmlp_*,
#             tpN_fattn_*) (`cargo run --release --example tp_graphs -- CARRY/multi`): `mucc
#             run --gpus N --check` and `mucc bench --gpus N --check` with the fused all-reduce
#             (their default) and with `--all-reduce nccl`, and `mucc bench --check` of the
#             unsharded tp1_* twin on one GPU (the speed-up's baseline); not a default step;
#             needs N GPUs; NCCL is taken from PyTorch's nvidia-nccl wheel when no libnccl.so is
#             found;
#   faults    a kernel fault (`mucc run --inject-fault`, a test hook) and a device-memory limit
#             (`--max-device-memory`) each give one clear error and exit 1 (not a default step).
#
#   scripts/gpu-test.sh CARRY OUT [FILE.json ...]
#
# CARRY holds the release `mucc` binary and Debian's libz3.so.4 (and, by default, the corpus
# under CARRY/corpus); OUT receives one log per file and step.
# MUCC_GPU_TEST_STEPS picks the steps (default "check sanitize bench"); MUCC_GPU_TEST_GRAPHS
# selects the graphs for check and bench ("--all", the default, or e.g. "--graph 0");
# MUCC_GPU_TEST_ARGS adds options to every mucc run and bench (e.g. "--path ampere").
# Input scales: the check runs gqa, mqa and mha files at 1.0 (where the online-softmax rewrite
# applies nothing overflows; elsewhere `mucc run --check` halves the scale by itself while a
# stored tensor or tile would overflow, and says so) and qknorm files at 0.2; sanitizers and
# bench run attention files at 0.5 (bench flags non-finite outputs, and mha's candidates keep
# the graph's exp, which overflows fp16 at 1.0). Exit status 0 only when every step passed.
set -u
carry="$1"; out="$2"; shift 2
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUCC_CACHE_DIR="${MUCC_CACHE_DIR:-/tmp/mucc-cache}"
files=("$@")
[ ${#files[@]} -eq 0 ] && files=("$carry"/corpus/*.json)
sel="${MUCC_GPU_TEST_GRAPHS:---all}"
extra="${MUCC_GPU_TEST_ARGS:-}"
steps=" ${MUCC_GPU_TEST_STEPS:-check sanitize bench} "
status=0
scale_of() {
    case "$1" in qknorm_*) echo 0.2;; *gqa_*|*mha_*|*mqa_*) echo 0.5;; *) echo 1.0;; esac
}
check_scale_of() {
    case "$1" in qknorm_*) echo 0.2;; *) echo 1.0;; esac
}
for f in "${files[@]}"; do
    name="$(basename "$f" .json)"
    scale="$(scale_of "$name")"
    if [[ "$steps" == *" check "* ]]; then
        t0=$(date +%s)
        # shellcheck disable=SC2086
        "$carry/mucc" run "$f" $sel $extra --check --scale "$(check_scale_of "$name")" > "$out/$name.run.log" 2>&1 || status=1
        printf '%-26s %s (%d s)\n' "$name" "$(tail -1 "$out/$name.run.log")" "$(( $(date +%s) - t0 ))"
    fi
    if [[ "$steps" == *" sanitize "* ]]; then
        compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
            "$carry/mucc" run "$f" --graph 0 $extra --check --scale "$scale" > "$out/$name.memcheck.log" 2>&1 || status=1
        printf '%-26s memcheck: %s\n' "$name" "$(grep -E 'ERROR SUMMARY' "$out/$name.memcheck.log" | tail -1)"
        # racecheck also reports hazards inside cuBLAS's own sm_90 GEMM kernels (nvjet_*, used
        # for kernel-level matmuls); excluding them makes the sanitizer fail, so count apart.
        compute-sanitizer --tool racecheck --print-limit 100 \
            "$carry/mucc" run "$f" --graph 0 $extra --check --scale "$scale" > "$out/$name.racecheck.log" 2>&1 || status=1
        ours=$(grep 'Race reported' "$out/$name.racecheck.log" | grep -vc 'nvjet_')
        theirs=$(grep 'Race reported' "$out/$name.racecheck.log" | grep -c 'nvjet_')
        [ "$ours" = 0 ] || status=1
        printf '%-26s racecheck: %s hazards in mucc kernels, %s in cuBLAS nvjet kernels\n' "$name" "$ours" "$theirs"
        compute-sanitizer --tool synccheck --error-exitcode 3 --print-limit 20 \
            "$carry/mucc" run "$f" --graph 0 $extra --check --scale "$scale" > "$out/$name.synccheck.log" 2>&1 || status=1
        printf '%-26s synccheck: %s\n' "$name" "$(grep -E 'ERROR SUMMARY' "$out/$name.synccheck.log" | tail -1)"
    fi
    if [[ "$steps" == *" bench "* ]]; then
        t0=$(date +%s)
        # shellcheck disable=SC2086
        "$carry/mucc" bench "$f" $sel $extra --scale "$scale" --json-out "$out/$name.bench.json" --svg "$out/$name.bench.svg" --force \
            > "$out/$name.bench.txt" 2>&1 || status=1
        printf '%-26s bench: %s (%d s)\n' "$name" "$(grep '^fastest' "$out/$name.bench.txt" | tail -1)" "$(( $(date +%s) - t0 ))"
    fi
done
if [[ "$steps" == *" generated "* ]]; then
    t0=$(date +%s)
    total_pass=0; total_fail=0
    for f in "$carry"/generated/*.json; do
        name="$(basename "$f" .json)"
        "$carry/mucc" run "$f" --all --check > "$out/$name.run.log" 2>&1 || status=1
        line="$(tail -1 "$out/$name.run.log")"
        p=$(sed -n 's/.* \([0-9]*\) passed.*/\1/p' <<< "$line"); f_=$(sed -n 's/.*passed, \([0-9]*\) failed.*/\1/p' <<< "$line")
        total_pass=$((total_pass + ${p:-0})); total_fail=$((total_fail + ${f_:-1}))
        printf '%-26s %s\n' "$name" "$line"
    done
    printf 'generated graphs: %d passed, %d failed (%d s)\n' "$total_pass" "$total_fail" "$(( $(date +%s) - t0 ))"
fi
if [[ "$steps" == *" decode "* ]]; then
    for f in "$carry"/decode/*.json; do
        name="$(basename "$f" .json)"
        # shellcheck disable=SC2086
        "$carry/mucc" run "$f" --all $extra --check > "$out/$name.run.log" 2>&1 || status=1
        printf '%-30s %s\n' "$name" "$(tail -1 "$out/$name.run.log")"
    done
fi
if [[ "$steps" == *" attention "* ]]; then
    for f in "$carry"/attn/*.json; do
        name="$(basename "$f" .json)"
        i=0
        for variant in "" "--warps graph" "--warps graph --path ampere"; do
            log="$out/$name.variant$i.run.log"
            i=$((i + 1))
            # shellcheck disable=SC2086
            "$carry/mucc" run "$f" $variant $extra --check > "$log" 2>&1 || status=1
            printf '%-36s %-28s %s\n' "$name" "${variant:-default}" "$(tail -1 "$log")"
        done
    done
fi
if [[ "$steps" == *" multi "* ]]; then
    have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    # cudarc looks for libnccl.so; pip's wheel (PyTorch's NCCL) ships libnccl.so.2 only.
    if ! ldconfig -p | grep -q 'libnccl.so '; then
        so="$(find / -name 'libnccl.so.2' -path '*nvidia/nccl*' 2>/dev/null | head -1)"
        if [ -n "$so" ]; then
            mkdir -p /tmp/mucc-nccl && ln -sf "$so" /tmp/mucc-nccl/libnccl.so
            export LD_LIBRARY_PATH="/tmp/mucc-nccl:$LD_LIBRARY_PATH"
        fi
    fi
    for f in "$carry"/multi/tp*.json; do
        name="$(basename "$f" .json)"
        n="${name#tp}"; n="${n%%_*}"
        [ "$n" -gt 1 ] || continue
        if [ "$have" -lt "$n" ]; then
            printf '%-30s skipped: needs %d GPUs, this machine has %d\n' "$name" "$n" "$have"
            status=1
            continue
        fi
        "$carry/mucc" run "$f" --gpus "$n" --check > "$out/$name.run.log" 2>&1 || status=1
        printf '%-30s %s\n' "$name" "$(tail -1 "$out/$name.run.log")"
        "$carry/mucc" run "$f" --gpus "$n" --check --all-reduce nccl > "$out/$name.run-nccl.log" 2>&1 || status=1
        printf '%-30s %s\n' "  NCCL all-reduce" "$(tail -1 "$out/$name.run-nccl.log")"
        "$carry/mucc" bench "$f" --gpus "$n" --check > "$out/$name.bench.txt" 2>&1 || status=1
        printf '%-30s %s\n' "  bench" "$(grep -E '^ +0 ' "$out/$name.bench.txt" | head -1)"
        "$carry/mucc" bench "$f" --gpus "$n" --check --all-reduce nccl > "$out/$name.bench-nccl.txt" 2>&1 || status=1
        printf '%-30s %s\n' "  bench, NCCL all-reduce" "$(grep -E '^ +0 ' "$out/$name.bench-nccl.txt" | head -1)"
        one="$carry/multi/tp1_${name#tp*_}.json"
        if [ -f "$one" ]; then
            # --check: the same input scale as the sharded run (lowered where fp16 overflows).
            "$carry/mucc" bench "$one" --check > "$out/$name.bench1.txt" 2>&1 || status=1
            # The table row of graph 0 (a '*' marks the fastest row).
            printf '%-30s %s\n' "  unsharded, 1 GPU" "$(grep -E '^[* ] +0 ' "$out/$name.bench1.txt" | head -1)"
        fi
    done
fi
if [[ "$steps" == *" faults "* ]]; then
    f="$carry/corpus/lora.json"
    "$carry/mucc" run "$f" --all --check --inject-fault > "$out/fault.log" 2>&1
    rc=$?
    n=$(grep -c "failed on the GPU" "$out/fault.log")
    printf 'fault: exit %d, %d fault report(s): %s\n' "$rc" "$n" "$(grep -m1 'failed on the GPU' "$out/fault.log" | cut -c1-160)"
    { [ "$rc" = 1 ] && [ "$n" = 1 ] && grep -q "^stopping" "$out/fault.log"; } || status=1
    "$carry/mucc" run "$f" --graph 0 --check --max-device-memory 1K > "$out/oom.log" 2>&1
    rc=$?
    printf 'device memory: exit %d: %s\n' "$rc" "$(grep -m1 'device memory' "$out/oom.log" | cut -c1-160)"
    { [ "$rc" = 1 ] && grep -q "device memory" "$out/oom.log"; } || status=1
fi
exit $status
