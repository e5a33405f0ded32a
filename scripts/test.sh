#!/usr/bin/env bash
# mucc's test command (what CI runs): formatting, lints, and every test.
#
# Tests run in release mode: the corpus tests run the f64 reference interpreter over every
# benchmark graph, which takes minutes even optimised. The CUDA compile checks use the pinned
# CUDA 13.0 wheels that scripts/cuda-toolchain.sh installs (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

# Debian's Z3 is needed by the layout solver; install it when it is missing and we can, so that
# a fresh machine is ready.
if ! { pkg-config --exists z3 2>/dev/null || [ -f /usr/include/z3.h ]; }; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        step "installing libz3-dev"
        apt-get install -y -q libz3-dev >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q libz3-dev >/dev/null) \
            || { echo "error: could not install libz3-dev, which mucc links"; exit 1; }
    else
        echo "error: libz3-dev is missing; install it (apt-get install libz3-dev)"; exit 1
    fi
fi

step "CUDA 13.0 toolchain (pip wheels, cached outside the repository)"
# shellcheck source=scripts/cuda-toolchain.sh
source scripts/cuda-toolchain.sh
nvcc --version | tail -1

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings (mucc and its Python extension)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc --no-deps --lib with warnings as errors (broken and private intra-doc links)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib

step "corpus compile check: 604 graphs x {sm_80, sm_90a} through nvcc and NVRTC (cached)"
# Its own step so that its figures (transpile and compile times, registers, spills) are printed;
# the full run below finds its outcomes in the cache.
start=$(date +%s)
log="$(mktemp)"
if ! cargo test --release --test corpus_cuda -- --nocapture > "$log" 2>&1; then
    tail -200 "$log"; echo "corpus compile check failed"; exit 1
fi
grep -E '^(transpile|nvcc|nvrtc|test result)' "$log" || true
rm -f "$log"
echo "corpus compile check took $(( $(date +%s) - start )) s"

step "cargo test --release (the corpus compile check ran above)"
start=$(date +%s)
cargo test --release -- --skip every_corpus_graph_transpiles_and_compiles_for_sm80_and_sm90a
echo "tests took $(( $(date +%s) - start )) s"

step "Python package: pip install ./python into a virtual environment, then pytest"
# maturin builds the extension in this workspace's target/ (reusing what cargo test built).
start=$(date +%s)
venv="target/pyvenv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check pytest numpy mypy ./python
"$venv/bin/python" -c "import mucc; print(mucc.load('../shared/corpus/mirage-benchmarks/lora.json')[0])"
"$venv/bin/pytest" -q python/tests
# The package is typed (py.typed): its sources type-check, and the extension's stub
# (mucc/_mucc.pyi) matches what the extension exports.
"$venv/bin/python" -m mypy --ignore-missing-imports python/mucc
"$venv/bin/python" -m mypy.stubtest mucc._mucc
echo "Python package took $(( $(date +%s) - start )) s"
