#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler toolchain from PyPI wheels (no GPU, no root needed):
# nvcc, nvvm, crt, runtime, cccl and nvrtc, plus the cuBLAS and NCCL headers (for generated
# files of multi-GPU graphs), into a cache directory outside the repository. Idempotent: a second run only checks the version.
#
#   source scripts/cuda-toolchain.sh      # installs if needed and exports CUDA_HOME, PATH, …
#   scripts/cuda-toolchain.sh             # installs if needed and prints the exports
#
# The GPU machines' driver (CUDA 13.0) rejects PTX from newer toolkits, so every package is
# pinned to 13.0.x (see toolchain.md §5–6 in the shared reference folder).
set -euo pipefail

MUCC_CUDA_PREFIX="${MUCC_CUDA_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/mucc/cuda-13.0.88}"
cu="$MUCC_CUDA_PREFIX/nvidia/cu13"

installed() {
    [ -x "$cu/bin/nvcc" ] && "$cu/bin/nvcc" --version 2>/dev/null | grep -q 'V13.0.88' \
        && [ -f "$cu/include/cublas_v2.h" ] && ls "$cu"/lib/libnvrtc.so.13* >/dev/null 2>&1
}

# The headers of a wheel (PKG==VERSION) whose paths start with PREFIX_DIR, extracted into the
# cache without the libraries (not needed to compile, and hundreds of MB).
headers_from_wheel() {
    local tmp
    tmp="$(mktemp -d)"
    python3 -m pip download -q --disable-pip-version-check --no-cache-dir --no-deps \
        -d "$tmp" "$1" >&2
    python3 - "$tmp" "$MUCC_CUDA_PREFIX" "$2" <<'PY'
import glob, sys, zipfile
tmp, prefix, keep = sys.argv[1], sys.argv[2], sys.argv[3]
for whl in glob.glob(tmp + "/*.whl"):
    with zipfile.ZipFile(whl) as z:
        z.extractall(prefix, [m for m in z.namelist() if m.startswith(keep)])
PY
    rm -rf "$tmp"
}

if ! installed; then
    command -v g++ >/dev/null || { echo "cuda-toolchain: a host g++ is required by nvcc" >&2; exit 1; }
    echo "cuda-toolchain: installing CUDA 13.0.88 wheels into $MUCC_CUDA_PREFIX" >&2
    mkdir -p "$MUCC_CUDA_PREFIX"
    python3 -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps --upgrade \
        --target "$MUCC_CUDA_PREFIX" \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 >&2
    # cuBLAS headers only (the library is 400+ MB and not needed to compile).
    headers_from_wheel nvidia-cublas==13.0.2.14 nvidia/cu13/include/
    installed || { echo "cuda-toolchain: installation failed" >&2; exit 1; }
fi

# NCCL headers only (the wheel is 300 MB, the library is not needed to compile); checked apart
# so that a cache from before they were added gets them without a reinstall.
nccl="$MUCC_CUDA_PREFIX/nvidia/nccl"
if [ ! -f "$nccl/include/nccl.h" ]; then
    echo "cuda-toolchain: installing the NCCL 2.28.9 headers into $MUCC_CUDA_PREFIX" >&2
    headers_from_wheel nvidia-nccl-cu13==2.28.9 nvidia/nccl/include/
    [ -f "$nccl/include/nccl.h" ] || { echo "cuda-toolchain: NCCL headers missing" >&2; exit 1; }
fi

exports="export CUDA_HOME='$cu'
export MUCC_NCCL_HOME='$nccl'
export MUCC_CUDA_HOME='$cu'
export PATH='$cu/bin':\"\$PATH\"
export LD_LIBRARY_PATH='$cu/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export NVCC='$cu/bin/nvcc'"
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    eval "$exports"
else
    echo "$exports"
fi
