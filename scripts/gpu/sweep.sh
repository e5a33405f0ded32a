# Device sweep: every graph of every corpus file except the two 190-candidate qknorm files, of
# which every 10th graph. Attention graphs at input scale 0.5, qknorm at 0.2 (see round.sh).
set -u
S=""
for j in carry/corpus/*.json; do
  f=$(basename "$j" .json)
  n=$(LD_LIBRARY_PATH=carry carry/mucc inspect "$j" 2>/dev/null | grep -c '^graph ')
  step=1; sc=1.0
  case "$f" in qknorm_*) step=10; sc=0.2;; gqa_*|mha_*|mqa_*|single_mqa_*) sc=0.5;; esac
  for ((g=0; g<n; g+=step)); do S="$S $j:$g:$sc"; done
done
echo "$(echo $S | wc -w) graphs"
MUCC_SANITIZE=0 bash scripts/gpu/check_graphs.sh carry $OUT sm_90a $S 2>&1 | grep -v "^warning" | grep -v " ok$"
