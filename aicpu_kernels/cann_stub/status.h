/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
#ifndef AICPU_CONTEXT_COMMON_STATUS_H
#define AICPU_CONTEXT_COMMON_STATUS_H

#include <cstdint>

namespace aicpu {
/* The codes the AI-CPU runtime interprets (the public header defines more). */
enum KernelStatus : uint32_t {
    KERNEL_STATUS_OK = 0,
    KERNEL_STATUS_PARAM_INVALID = 1,
    KERNEL_STATUS_INNER_ERROR = 2,
};
} // namespace aicpu

#endif
