/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
#ifndef CPU_KERNEL_TENSOR_H
#define CPU_KERNEL_TENSOR_H

#include <cstdint>

#include "cpu_types.h"

namespace aicpu {
class AICPU_VISIBILITY Tensor {
    friend class CpuKernelUtils; /* stub: the test harness builds tensors (cann_stub_testing.h) */

public:
    Tensor() = delete;
    ~Tensor() = default;

    void *GetData() const;
    uint64_t GetDataSize() const;
    int64_t NumElements() const;

private:
    Tensor(void *data, uint64_t bytes, int64_t elements);
    void *data_;
    uint64_t bytes_;
    int64_t elements_;
};
} // namespace aicpu

#endif
