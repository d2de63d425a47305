#!/usr/bin/env bash
# tools/build_aicpu_kernel.sh -- build the AI-CPU tiling kernel with CANN on a real machine.
#
# Usage: tools/build_aicpu_kernel.sh [classic|ascendc|runtime|npu_ext|all|cross] [build-root]
#   classic  the aicpu::CpuKernel operator AicpuTilingPlan -> libaicpu_tiling_kernels.so
#            plus its op info aicpu_tiling_plan.json (any CANN with the AI-CPU toolchain)
#   ascendc  the Ascend C entry aicpu_tiling_kernel -> libaicpu_tiling_ascendc.a
#            (CANN >= 9.0, Atlas A2/A3)
#   runtime  the Ascend C entry as a plain AArch64 .so -> libaicpu_tiling_runtime.so plus
#            libaicpu_tiling_runtime.json beside it (same stem: the runtime loads <JSON stem>.so):
#            the device side of the torch_npu extension
#            (runtime launch route, aicpu_kernels/npu_ext/launch_route.h)
#   npu_ext  the torch_npu extension libaicpu_tiling_npu.so (needs torch and torch_npu
#            importable by ${PYTHON:-python3})
#   all      classic, ascendc, runtime (default); ascendc is skipped on CANN < 9.0
#   cross    no CANN needed: cross-compile the kernel and every AI-CPU entry for aarch64 with
#            ziglang (pip install ziglang) into <build-root>/cross, as CI does
# Output goes to <build-root>/<target>/install (default build-root: build/aicpu).
#
# Needs: CANN's environment (source <CANN>/set_env.sh, which sets ASCEND_HOME_PATH or
# ASCEND_TOOLKIT_HOME), cmake >= 3.16. Nothing here has run on a machine with CANN yet;
# see docs/aicpu-kernel.md.
#
# Without CANN, test the wrappers on the host instead:
#   python -m pytest tests/test_aicpu_entry.py
set -euo pipefail

die() {
    echo "build_aicpu_kernel.sh: $*" >&2
    exit 1
}

what="${1:-all}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_root="${2:-${root}/build/aicpu}"

case "${what}" in
    classic | ascendc | runtime | npu_ext | all) ;;
    cross)
        exec "${PYTHON:-python3}" -c 'import sys; sys.path.insert(0, sys.argv[1]); from pyruntime.cli.aarch64 import main; sys.exit(main(["build", sys.argv[2]]))' "${root}" "${build_root}/cross"
        ;;
    -h | --help)
        sed -n '2,24p' "${BASH_SOURCE[0]}"
        exit 0
        ;;
    *) die "the target must be classic, ascendc, runtime, npu_ext, all or cross, not '${what}'." ;;
esac

command -v cmake >/dev/null 2>&1 || die "cmake (3.16 or newer) is needed but was not found on PATH."

ascend="${ASCEND_HOME_PATH:-${ASCEND_TOOLKIT_HOME:-}}"
if [[ -z "${ascend}" ]]; then
    die "CANN is not set up: neither ASCEND_HOME_PATH nor ASCEND_TOOLKIT_HOME is set. Install the CANN toolkit and run 'source <CANN install dir>/set_env.sh' (for example /usr/local/Ascend/ascend-toolkit/set_env.sh), then run this script again; to test the wrappers without CANN, run 'python -m pytest tests/test_aicpu_entry.py'."
fi
if [[ ! -d "${ascend}" ]]; then
    die "CANN is not installed where the environment says: '${ascend}' (from ASCEND_HOME_PATH or ASCEND_TOOLKIT_HOME) is not a directory."
fi

find_cross() {
    local d
    for d in toolkit/toolchain/hcc/bin tools/hcc/bin toolchain/toolchain/hcc/bin; do
        if [[ -x "${ascend}/${d}/aarch64-target-linux-gnu-g++" ]]; then
            echo "${ascend}/${d}"
            return 0
        fi
    done
    return 1
}

has_ascendc_aicpu() {
    local d
    for d in compiler/tikcpp/ascendc_kernel_cmake tools/tikcpp/ascendc_kernel_cmake; do
        if compgen -G "${ascend}/${d}/*[Aa][Ii][Cc][Pp][Uu]*onfig.cmake" >/dev/null \
            || compgen -G "${ascend}/${d}/*/*[Aa][Ii][Cc][Pp][Uu]*onfig.cmake" >/dev/null; then
            return 0
        fi
    done
    return 1
}

# Configure, build and install one AI-CPU CMake target with CANN's cross compiler.
cmake_aicpu_target() {  # cmake_aicpu_target <classic|runtime> <hint when the compiler is missing>
    local target="$1" hint="$2" cross
    cross="$(find_cross)" || die "CANN's AI-CPU cross compiler aarch64-target-linux-gnu-g++ was not found under '${ascend}' (looked in toolkit/toolchain/hcc/bin and tools/hcc/bin); ${hint}"
    echo "== ${target} AI-CPU kernel (compiler ${cross}/aarch64-target-linux-gnu-g++)"
    cmake -S "${root}/aicpu_kernels" -B "${build_root}/${target}" \
        -DAICPU_TILING_TARGET="${target}" \
        -DASCEND_CANN_PACKAGE_PATH="${ascend}" \
        -DAICPU_TILING_CROSS_DIR="${cross}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="${build_root}/${target}/install"
    cmake --build "${build_root}/${target}" -j "$(nproc 2>/dev/null || echo 4)"
    cmake --install "${build_root}/${target}"
}

build_classic() {
    cmake_aicpu_target classic "install the CANN toolkit that includes the AI-CPU toolchain."
    echo "== built ${build_root}/classic/install/lib/libaicpu_tiling_kernels.so"
    echo "   op info: ${build_root}/classic/install/config/aicpu_tiling_plan.json"
}

build_runtime() {
    cmake_aicpu_target runtime "install the CANN toolkit that includes the AI-CPU toolchain, or run '$0 cross' to check the build with ziglang."
    echo "== built ${build_root}/runtime/install/lib/libaicpu_tiling_runtime.so"
    echo "   op info: ${build_root}/runtime/install/lib/libaicpu_tiling_runtime.json"
}

build_npu_ext() {
    local py="${PYTHON:-python3}" torch_prefix torch_npu_root
    torch_prefix="$("${py}" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
        || die "torch is not importable by ${py}; install torch (and torch_npu) first."
    torch_npu_root="$("${py}" -c 'import os, torch_npu; print(os.path.dirname(torch_npu.__file__))')" \
        || die "torch_npu is not importable by ${py}; install the torch_npu matching torch and CANN."
    echo "== torch_npu extension (torch ${torch_prefix}, torch_npu ${torch_npu_root})"
    cmake -S "${root}/aicpu_kernels/npu_ext" -B "${build_root}/npu_ext" \
        -DASCEND_CANN_PACKAGE_PATH="${ascend}" \
        -DCMAKE_PREFIX_PATH="${torch_prefix}" \
        -DTORCH_NPU_ROOT="${torch_npu_root}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="${build_root}/npu_ext/install"
    cmake --build "${build_root}/npu_ext" -j "$(nproc 2>/dev/null || echo 4)"
    cmake --install "${build_root}/npu_ext"
    echo "== built ${build_root}/npu_ext/install/lib/libaicpu_tiling_npu.so; load it with"
    echo "   torch.ops.load_library(...) then, before capture,"
    echo "   torch.ops.aicpu_tiling.npu_load_tiling_kernel('${build_root}/runtime/install/lib/libaicpu_tiling_runtime.json')"
}

build_ascendc() {
    if ! has_ascendc_aicpu; then
        if [[ "${what}" == "ascendc" ]]; then
            die "the Ascend C AI-CPU entry needs CANN 9.0 or newer, and the toolkit at '${ascend}' has no AICPU CMake package under compiler/tikcpp/ascendc_kernel_cmake; build the classic kernel instead."
        fi
        echo "== skipping the Ascend C AI-CPU entry: the toolkit at '${ascend}' is older than CANN 9.0 (no AICPU CMake package)."
        return 0
    fi
    echo "== Ascend C AI-CPU entry"
    cmake -S "${root}/aicpu_kernels" -B "${build_root}/ascendc" \
        -DAICPU_TILING_TARGET=ascendc \
        -DASCEND_CANN_PACKAGE_PATH="${ascend}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="${build_root}/ascendc/install"
    cmake --build "${build_root}/ascendc" -j "$(nproc 2>/dev/null || echo 4)"
    cmake --install "${build_root}/ascendc"
    echo "== built ${build_root}/ascendc/install/lib/libaicpu_tiling_ascendc.a"
}

case "${what}" in
    classic) build_classic ;;
    ascendc) build_ascendc ;;
    runtime) build_runtime ;;
    npu_ext) build_npu_ext ;;
    all)
        build_classic
        build_ascendc
        build_runtime
        ;;
esac
