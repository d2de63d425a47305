#!/usr/bin/env bash
# Download the wheels and source archives the tests read (never installed): vllm-ascend for
# the import-hook conformance tests (every release 0.23.0-0.30.0rc2: its x86_64 cp311 wheel
# where the release has one, else its sdist, fetched by tools/fetch_sdists.py from pip's own
# index and checked against the index's sha256, since `pip download` of these sdists fails
# at metadata generation); torch_npu (its ACL and torch_npu headers) and torch 2.10
# (its headers, which torch_npu 2.10's headers need) for the extension's compile checks.
# Usage: tools/fetch_wheels.sh            (cache: ${AICPU_TILING_WHEEL_CACHE:-$HOME/.cache/aicpu-tiling/wheels})
# Exit 0 when every file is present afterwards; 1 when a download failed (tests then skip,
# or fail under CI=true).
set -u
cache="${AICPU_TILING_WHEEL_CACHE:-$HOME/.cache/aicpu-tiling/wheels}"
mkdir -p "$cache"
status=0
fetch() {  # fetch <glob> <pip args...>
    local glob="$1"; shift
    if compgen -G "$cache/$glob" > /dev/null; then return 0; fi
    "${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: -d "$cache" "$@" -q || {
        echo "fetch_wheels: could not download $*" >&2; status=1; }
}
fetch 'vllm_ascend-0.23.0-*.whl' vllm-ascend==0.23.0
fetch 'vllm_ascend-0.24.0rc1-*.whl' vllm-ascend==0.24.0rc1
fetch 'vllm_ascend-0.25.1rc1-*.whl' vllm-ascend==0.25.1rc1
fetch 'vllm_ascend-0.26.0rc1-*.whl' vllm-ascend==0.26.0rc1
# Releases without wheels (0.23.0.post1; 0.27.1rc1 and later ship only sdists).
"${PYTHON:-python3}" "$(dirname "$0")/fetch_sdists.py" "$cache" vllm-ascend \
    0.23.0.post1 0.27.1rc1 0.28.0rc1 0.29.0rc1 0.30.0rc1 0.30.0rc2 || status=1
fetch 'torch_npu-2.10.0.post4-*.whl' torch_npu==2.10.0.post4 \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp
# torch 2.10 for its headers only: the aarch64 wheel (CPU-only, 146 MB) is much smaller than
# PyPI's x86_64 one (which depends on CUDA); torch/include is the same C++ headers.
fetch 'torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl' torch==2.10.0 \
    --platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp
exit $status
