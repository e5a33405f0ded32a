# Device round: Mma self-test (sm_90a, sm_80 code, element loads only), then goldens and graph 0
# of every corpus file.
set -u
nvcc -std=c++17 -arch=sm_90a -I runtime-headers scripts/gpu/mma_selftest.cu -o /tmp/mma && /tmp/mma | grep -v "load modes A" | grep -E "wrong|ok|FAILED" | sed 's/^/default: /' | tail -16
nvcc -std=c++17 -arch=sm_80 -I runtime-headers scripts/gpu/mma_selftest.cu -o /tmp/mma80 && echo "sm_80 code: $(/tmp/mma80 | tail -1)"
nvcc -std=c++17 -arch=sm_90a -DMUCC_SELFTEST_ELEMENTS -I runtime-headers scripts/gpu/mma_selftest.cu -o /tmp/mmas && echo "element loads only: $(/tmp/mmas | tail -1)"
S=""
for j in golden/kernel/*.json golden/threadblock/*.json; do
  case "$j" in *.plan.json) continue;; esac
  sc=1.0; case "$j" in *attention_*) sc=0.5;; esac
  S="$S $j:0:$sc"
done
for f in gated_mlp lora single_lora legacy_checkpoint_lora single_gated_mlp rmsnorm_bs1 rmsnorm_bs8 ntrans_bs1 ntrans_bs8; do S="$S carry/corpus/$f.json:0:1.0"; done
for f in gqa_bs1 gqa_bs8 mha_bs1 mha_bs8 mqa_bs1 mqa_bs8 single_mqa_bs1; do S="$S carry/corpus/$f.json:0:0.5"; done
# qknorm: exp of unnormalised scores; the f64 interpreter never overflows, fp16 does past 11.
for f in qknorm_gqa_bs1 qknorm_gqa_bs8; do S="$S carry/corpus/$f.json:0:0.2"; done
S="$S carry/corpus/gated_mlp.json:2:1.0 carry/corpus/legacy_checkpoint_lora.json:1:1.0 carry/corpus/ntrans_bs1.json:2:1.0"
MUCC_SANITIZE=${MUCC_SANITIZE:-0} bash scripts/gpu/check_graphs.sh carry $OUT sm_90a $S 2>&1 | grep -v "^warning" | grep -v " ok$"
