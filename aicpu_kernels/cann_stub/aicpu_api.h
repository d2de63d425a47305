/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
#ifndef AICPU_TILING_STUB_AICPU_API_H
#define AICPU_TILING_STUB_AICPU_API_H

/* Execution-space specifiers: keywords of the CANN AI-CPU compiler, nothing on a host. */
#define __global__
#define __aicpu__

namespace AscendC {
/* On the device: wait until every store before it is globally visible. Here: a full
 * compiler/hardware fence plus a call counter the tests read. */
void DataStoreBarrier();
} // namespace AscendC

#endif
