#!/usr/bin/env bash
# CTA shape before/after on the decode graphs (issue 14): `mucc bench --check` with the cost
# model's CTA and with --warps graph, PyTorch in the same run (scripts/gpu/decode_vs_torch.py).
#   bash scripts/gpu/cta_decode.sh OUT     (repository root; carry/ holds mucc and carry/decode)
set -u
O="$1"; mkdir -p "$O/dauto" "$O/dgraph"
export MUCC_CACHE_DIR=/tmp/mc LD_LIBRARY_PATH=$PWD/carry:/usr/local/cuda/lib64
for f in carry/decode/*.json; do n=$(basename $f .json)
  for v in auto graph; do d=$O/d$v
    carry/mucc bench $f --check --warps $v --json-out $d/$n.bench.json --force > $d/$n.txt 2>&1 || echo "$n $v failed: $(tail -2 $d/$n.txt)"
  done
done
python3 scripts/gpu/decode_vs_torch.py --decode carry/decode --bench graph="$O/dgraph" auto="$O/dauto" > "$O/decode.md" 2> "$O/decode.log"
cat "$O/decode.md"
tar czf "$O/decode.tgz" -C "$O" dauto dgraph && rm -rf "$O/dauto" "$O/dgraph"
