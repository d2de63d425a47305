/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
/*
 * Test-only API of the stand-in (no CANN counterpart): build contexts with host
 * buffers, look kernels up by op type, count DataStoreBarrier() calls.
 */
#ifndef AICPU_TILING_CANN_STUB_TESTING_H
#define AICPU_TILING_CANN_STUB_TESTING_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_kernel.h"

namespace aicpu {
class CpuKernelUtils {
public:
    /* A context for op type `op` with no inputs, outputs or attributes. */
    static std::unique_ptr<CpuKernelContext> NewContext(const std::string &op);
    /* Append a tensor over caller-owned memory; data may be nullptr (an absent optional
     * input). elements < 0 means unknown, as NumElements() reports it. */
    static void AddInput(CpuKernelContext &ctx, void *data, uint64_t bytes, int64_t elements);
    static void AddOutput(CpuKernelContext &ctx, void *data, uint64_t bytes, int64_t elements);
    static void SetAttrInt(CpuKernelContext &ctx, const std::string &name, int64_t value);
    static void SetAttrListInt(CpuKernelContext &ctx, const std::string &name,
                               const std::vector<int64_t> &values);
    /* The kernel REGISTER_CPU_KERNEL registered under `type`, or nullptr. */
    static std::shared_ptr<CpuKernel> CreateKernel(const std::string &type);
};
} // namespace aicpu

namespace AscendC {
/* DataStoreBarrier() calls since the program started. */
unsigned long StubDataStoreBarrierCount();
} // namespace AscendC

#endif
