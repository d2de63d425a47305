#!/usr/bin/env bash
# tools/build_aicpu_kernel.sh -- build the AI-CPU tiling kernel with CANN on a real machine.
#
# Usage: tools/build_aicpu_kernel.sh [classic|ascendc|all] [build-root]
#   classic  the aicpu::CpuKernel operator AicpuTilingPlan -> libaicpu_tiling_kernels.so
#            plus its op info aicpu_tiling_plan.json (any CANN with the AI-CPU toolchain)
#   ascendc  the Ascend C entry aicpu_tiling_kernel -> libaicpu_tiling_ascendc.a
#            (CANN >= 9.0, Atlas A2/A3)
#   all      both (default); the ascendc part is skipped with a notice on CANN < 9.0
# Output goes to <build-root>/{classic,ascendc}/install (default build-root: build/aicpu).
#
# Needs: CANN's environment (source <CANN>/set_env.sh, which sets ASCEND_HOME_PATH or
# ASCEND_TOOLKIT_HOME), cmake >= 3.16. Nothing here has run on a machine with CANN yet;
# see the README section "AI-CPU kernel".
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
    classic | ascendc | all) ;;
    -h | --help)
        sed -n '2,19p' "${BASH_SOURCE[0]}"
        exit 0
        ;;
    *) die "the target must be classic, ascendc or all, not '${what}'." ;;
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

build_classic() {
    local cross
    cross="$(find_cross)" || die "CANN's AI-CPU cross compiler aarch64-target-linux-gnu-g++ was not found under '${ascend}' (looked in toolkit/toolchain/hcc/bin and tools/hcc/bin); install the CANN toolkit that includes the AI-CPU toolchain."
    echo "== classic AI-CPU kernel (compiler ${cross}/aarch64-target-linux-gnu-g++)"
    cmake -S "${root}/aicpu_kernels" -B "${build_root}/classic" \
        -DAICPU_TILING_TARGET=classic \
        -DASCEND_CANN_PACKAGE_PATH="${ascend}" \
        -DAICPU_TILING_CROSS_DIR="${cross}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="${build_root}/classic/install"
    cmake --build "${build_root}/classic" -j "$(nproc 2>/dev/null || echo 4)"
    cmake --install "${build_root}/classic"
    echo "== built ${build_root}/classic/install/lib/libaicpu_tiling_kernels.so"
    echo "   op info: ${build_root}/classic/install/config/aicpu_tiling_plan.json"
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
    all)
        build_classic
        build_ascendc
        ;;
esac
