#!/usr/bin/env bash
# Times the same graphs with two mucc binaries in one run on one GPU (e.g. before and after a
# refactor that should not change the kernels' speed): A, B, A again for each graph, so the
# spread of A's two samples shows the noise.
#
#   scripts/gpu/bench_pair.sh MUCC_A MUCC_B OUT FILE:GRAPH[:SCALE] ...
#
# Both binaries need libz3.so.4 on LD_LIBRARY_PATH. Prints one line per graph: µs of A, B, A and
# B / mean(A); JSON reports land in OUT. `MUCC_PAIR_A_ARGS` and `MUCC_PAIR_B_ARGS` add options to
# A's and B's `mucc bench` (one binary twice compares an option with the default, e.g.
# `MUCC_PAIR_B_ARGS="--dependent-launch --check" bench_pair.sh carry/mucc carry/mucc OUT …`).
set -u
a="$1"; b="$2"; out="$3"; shift 3
a_args="${MUCC_PAIR_A_ARGS:-}"; b_args="${MUCC_PAIR_B_ARGS:-}"
mkdir -p "$out"
us() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['graphs'][0]; print(r.get('median_us', 'nan'))" "$1" 2>/dev/null || echo nan; }
printf '%-28s %10s %10s %10s %8s\n' graph "A µs" "B µs" "A µs" "B/A"
for spec in "$@"; do
    IFS=: read -r json graph scale <<< "$spec"
    scale="${scale:-1.0}"
    name="$(basename "$json" .json).g$graph"
    for run in a1 b a2; do
        bin="$a"; args="$a_args"
        [ "$run" = b ] && bin="$b" && args="$b_args"
        # shellcheck disable=SC2086
        "$bin" bench "$json" --graph "$graph" --scale "$scale" --json-out "$out/$name.$run.json" --force \
            $args > "$out/$name.$run.txt" 2>&1
    done
    ta1=$(us "$out/$name.a1.json"); tb=$(us "$out/$name.b.json"); ta2=$(us "$out/$name.a2.json")
    ratio=$(python3 -c "print(f'{float(\"$tb\") / ((float(\"$ta1\") + float(\"$ta2\")) / 2):.3f}')" 2>/dev/null || echo nan)
    printf '%-28s %10s %10s %10s %8s\n' "$name" "$ta1" "$tb" "$ta2" "$ratio"
done
