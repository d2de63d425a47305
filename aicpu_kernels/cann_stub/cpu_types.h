/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
#ifndef CPU_KERNEL_TYPES_H
#define CPU_KERNEL_TYPES_H

#define AICPU_VISIBILITY __attribute__((visibility("default")))

namespace aicpu {
enum DeviceType { HOST, DEVICE };
} // namespace aicpu

#endif
