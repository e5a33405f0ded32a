#!/usr/bin/env bash
# CTA shape before/after (issue 14): `mucc bench --all` on corpus benchmark files with the cost
# model's CTA (default) and with the µGraph's block_dim (--warps graph), then
# scripts/bench_vs_torch.py (eager, torch.compile, SDPA) in the same run.
#   bash scripts/gpu/cta_bench.sh OUT [WORKLOAD ...]   (repository root, binary and corpus in carry/)
set -u
O="$1"; shift; W="${*:-gated_mlp rmsnorm_bs1 rmsnorm_bs8 gqa_bs1 gqa_bs8 mqa_bs1 mqa_bs8 mha_bs1 mha_bs8 ntrans_bs1 ntrans_bs8 lora qknorm_gqa_bs1}"
export MUCC_CACHE_DIR=/tmp/mc LD_LIBRARY_PATH=$PWD/carry:/usr/local/cuda/lib64
scale() { case "$1" in qknorm_*) echo 0.1;; *gqa_*|*mha_*|*mqa_*) echo 0.5;; *) echo 1.0;; esac; }
mkdir -p "$O/auto" "$O/graph"
t0=$(date +%s)
for n in $W; do
  for v in auto graph; do
    carry/mucc bench carry/corpus/$n.json --all --json --scale $(scale $n) --iters 30 --warps $v > "$O/$v/$n.bench.json" 2> "$O/$v/$n.err" || echo "$n $v failed: $(tail -1 $O/$v/$n.err)"
  done
  echo "$n $(( $(date +%s) - t0 )) s"
done
python3 scripts/bench_vs_torch.py --mucc-json "$O/auto" --only $W --iters 30 --save-torch "$O/torch.json" > "$O/table-auto.md" 2> "$O/torch.log"
python3 scripts/bench_vs_torch.py --mucc-json "$O/graph" --only $W --iters 30 --torch-json "$O/torch.json" > "$O/table-graph.md" 2>> "$O/torch.log"
cat "$O/table-auto.md"; echo; cat "$O/table-graph.md"
echo "total $(( $(date +%s) - t0 )) s"
tar czf "$O/json.tgz" -C "$O" auto graph && rm -rf "$O/auto" "$O/graph"
