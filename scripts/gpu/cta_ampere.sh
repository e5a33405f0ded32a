#!/usr/bin/env bash
# CTA shape on the Ampere path of an sm_90a GPU (issue 14): `mucc run --check --all --path ampere`
# over the corpus with the cost model's CTA, then the best candidate of six files with --warps graph
# and with the default.   bash scripts/gpu/cta_ampere.sh OUT   (repository root; carry/ as gpu-test.sh)
set -u
O="$1"; mkdir -p "$O/e"
export MUCC_CACHE_DIR=/tmp/mc LD_LIBRARY_PATH=$PWD/carry:/usr/local/cuda/lib64
MUCC_GPU_TEST_STEPS="check" MUCC_GPU_TEST_ARGS="--path ampere" timeout 330 bash scripts/gpu-test.sh carry "$O/e" > "$O/check.txt" 2>&1; echo "rc=$?" >> "$O/check.txt"
grep -v "passed, 0 failed" "$O/check.txt"; echo "files passed: $(grep -c 'passed, 0 failed' $O/check.txt)"
scale() { case "$1" in *gqa_*|*mha_*|*mqa_*) echo 0.5;; *) echo 1.0;; esac; }
for n in gqa_bs1 mqa_bs1 mha_bs1 ntrans_bs1 gated_mlp rmsnorm_bs8; do
  for v in graph auto; do
    t=$(timeout 60 carry/mucc bench carry/corpus/$n.json --all --json --scale $(scale $n) --iters 30 --path ampere --warps $v 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); ok=[g for g in d['graphs'] if g.get('ok')]; b=min(ok,key=lambda g:g['median_us']); print(f\"{b['median_us']:.2f} (g{b['graph']})\")")
    echo "$n ampere warps=$v: $t"
  done
done
tar czf "$O/e.tgz" -C "$O" e && rm -rf "$O/e"
